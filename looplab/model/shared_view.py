"""Training a looped LM in the ``shared`` KV cache's own view of earlier tokens (docs/methods.md §9).

Under the ``shared`` cache a token at loop t attends to every earlier token's keys and values of
that token's *last* loop, and to its own of loop t; the ordinary unroll (what ``per_loop`` gives)
attends to the earlier tokens' loop-t keys and values. Training in the shared view takes two
unrolls from the same h_0 and e:

    pass 1   the ordinary unroll to depth K, recording each core layer's keys and values at loop K
    pass 2   the unroll again, each core layer's query i reading positions j < i through pass 1's
             loop-K keys and values and itself through its own (``attend_earlier``)

Pass 2 is the shared view exactly except that the earlier tokens' last-loop keys come from the
ordinary unroll, not from their own shared-view unroll; iterating pass 2 (each time on the last
pass's keys) converges to the cache's view position by position, and after L passes equals it (the
tests check this against teacher-forced decoding through the ``shared`` cache). Gradients flow into
both passes, so pass 1's last loop is trained to be read by pass 2.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from looplab.model.attention import AttentionContext


def shared_view_pass(
    model,
    h: Tensor,
    e: Tensor,
    ctx: AttentionContext,
    loops: int,
    earlier: dict | None = None,
    backprop_loops: int = 0,
) -> tuple[Tensor, dict]:
    """``loops`` loops from h_0 (h, e [B, L, d]); with ``earlier`` ({core attention module: (k, v)
    [B, H, L, Dh]}) each core layer reads earlier positions through it. Returns (h_loops [B, L, d], the
    core layers' keys and values of the last loop, keyed as ``earlier``). ``backprop_loops`` k > 0
    detaches the state k loops before the last, as :func:`looplab.model.depths.at_depths` does."""
    record: dict = {}
    view = replace(ctx, record=record, earlier=earlier)
    for t in range(1, loops + 1):
        if backprop_loops > 0 and loops - (t - 1) == backprop_loops:
            h = h.detach()
        h = model.step(h, e, view)
    return h, {layer.attn: record[layer.attn] for layer in model.core}


def shared_view_logits(
    model,
    tokens: Tensor,
    valid: Tensor,
    loops: int,
    generator: torch.Generator | None = None,
    backprop_loops: int = 0,
) -> tuple[Tensor, Tensor]:
    """tokens, valid [B, L] → (ordinary logits [B, L, V] after ``loops`` loops, the shared view's [B, L, V])."""
    h0, e, ctx = model.start(tokens, valid, generator)
    h, last = shared_view_pass(model, h0, e, ctx, loops, None, backprop_loops)
    viewed, _ = shared_view_pass(model, h0, e, ctx, loops, last, backprop_loops)
    return model.readout(h, ctx), model.readout(viewed, ctx)


def shared_view_at_depths(
    model,
    tokens: Tensor,
    valid: Tensor,
    depths: Tensor,
    generator: torch.Generator | None = None,
    backprop_loops: int = 0,
) -> tuple[Tensor, Tensor]:
    """:func:`shared_view_logits` at each row's own depth (depths [B] long), rows of one depth unrolled
    together; returns both logits [B, L, V] in the batch's order."""
    values = torch.unique(depths).tolist()
    if len(values) == 1:
        return shared_view_logits(model, tokens, valid, int(values[0]), generator, backprop_loops)
    ordinary, viewed = None, None
    for depth in values:
        rows = (depths == depth).nonzero(as_tuple=True)[0].to(tokens.device)
        part = shared_view_logits(model, tokens[rows], valid[rows], int(depth), generator, backprop_loops)
        if ordinary is None:
            ordinary = part[0].new_zeros((len(tokens), *part[0].shape[1:]))
            viewed = torch.zeros_like(ordinary)
        ordinary = ordinary.index_copy(0, rows, part[0])
        viewed = viewed.index_copy(0, rows, part[1])
    return ordinary, viewed
