"""Reading a looped model at a separate depth per row, for any model of the looped-model protocol.

The schedules' training objectives ask for logits at each row's own depth(s)
(``forward_at_depths``), and for the states there (``probe_at_depths``) when a one-loop
regulariser looks at them. :func:`at_depths` computes both from the protocol alone
(``start`` / ``step`` / ``readout``, ``context(valid)`` and ``ctx.select(rows)``), so
looplab's own transformer and a wrapped pretrained model train under the same schedules.

It works by active-set compaction: rows are sorted by depth, the rows still running
are a prefix of the batch, and a row leaves as soon as its last requested depth is
reached, so work is proportional to Σᵢ τᵢ instead of batch × max τ.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from looplab.model.protocol import LoopedModel, LoopProbe


def at_depths(
    model: LoopedModel,
    tokens: Tensor,
    valid: Tensor,
    depths: Tensor,
    generator: torch.Generator | None = None,
    backprop_loops: int = 0,
    probe: bool = False,
) -> tuple[Tensor, LoopProbe | None]:
    """Logits read at each row's own depths, and (if ``probe``) each row's state at its last depth.

    Args:
        tokens, valid: [B, L].
        depths: [B] or [B, J] long; entry (i, j) asks for row i read out after
            depths[i, j] loops. Entries <= 0 are unused slots (their logits are 0).
        backprop_loops: if k > 0, gradients flow through each row's last k loops only
            (truncated backprop: the state is detached k loops before the row's last depth).

    A model whose ``checkpoint_loops`` is set keeps only each loop's input for the backward pass and
    recomputes the loop there (``train.checkpoint_loops``).

    Returns:
        (logits [B, L, V] for [B] depths or [B, J, L, V] for [B, J] depths, a :class:`LoopProbe` of each
        row's state at its last depth (with gradient) or None).
    """
    single = depths.dim() == 1
    depths = depths.view(depths.shape[0], -1).to(tokens.device)
    batch, slots = depths.shape
    last = depths.max(dim=1).values
    h, e_rows, start_ctx = model.start(tokens, valid, generator)
    order = torch.argsort(last, descending=True, stable=True)
    e, sorted_ctx = e_rows, start_ctx
    if not _is_identity(order):  # rows already in depth order (a fixed depth) need no gathers
        e, h, depths, last = e_rows[order], h[order], depths[order], last[order]
        sorted_ctx = start_ctx.select(order)  # the context start built (a family's may hold the token ids)
    loops = torch.arange(1, int(last[0]) + 1, device=last.device)
    remaining = (last[None, :] >= loops[:, None]).sum(1).tolist()  # active rows at each loop
    states, where, finals, final_rows = [], [], [], []
    for t, active in enumerate(remaining, start=1):
        h, e, ctx = h[:active], e[:active], sorted_ctx.select(slice(None, active))
        if backprop_loops > 0:
            cut = (last[:active] - (t - 1)) == backprop_loops
            h = torch.where(cut[:, None, None], h.detach(), h)
        if getattr(model, "checkpoint_loops", False) and torch.is_grad_enabled():  # recomputed in the backward
            h = checkpoint(model.step, h, e, ctx, use_reentrant=False)
        else:
            h = model.step(h, e, ctx)
        rows, cols = (depths[:active] == t).nonzero(as_tuple=True)
        if len(rows):
            states.append(_select_rows(h, rows))
            where.append(order[rows] * slots + cols)
        if probe:
            done = (last[:active] == t).nonzero(as_tuple=True)[0]
            finals.append(_select_rows(h, done))
            final_rows.append(order[done])
    # One readout over every requested (row, slot); the logits then go back
    # to their original positions (unless already there), and unused slots stay zero.
    where = torch.cat(where) if where else torch.zeros(0, dtype=torch.long, device=tokens.device)
    chosen = _concat(states) if states else h.new_zeros((0, *h.shape[1:]))
    in_place = len(where) == batch * slots and _is_identity(where)
    readout_ctx = sorted_ctx if in_place and slots == 1 else start_ctx.select(where // slots)
    flat = model.readout(chosen, readout_ctx)
    if not in_place:
        flat = flat.new_zeros((batch * slots, *flat.shape[1:])).index_copy(0, where, flat)
    flat = flat.view(batch, slots, *flat.shape[1:])
    logits = flat[:, 0] if single else flat
    if not probe:
        return logits, None
    return logits, LoopProbe(
        _select_rows(_concat(finals), torch.argsort(_concat(final_rows))), e_rows, valid, start_ctx
    )


class ReadAtDepths:
    """``forward_at_depths`` / ``probe_at_depths`` for a model of the looped-model protocol (:func:`at_depths`)."""

    def forward_at_depths(
        self,
        tokens: Tensor,
        valid: Tensor,
        depths: Tensor,
        generator: torch.Generator | None = None,
        backprop_loops: int = 0,
    ) -> Tensor:
        """Logits at each row's own depths: [B, L, V] for [B] depths, [B, J, L, V] for [B, J] (:func:`at_depths`)."""
        return at_depths(self, tokens, valid, depths, generator, backprop_loops)[0]

    def probe_at_depths(
        self,
        tokens: Tensor,
        valid: Tensor,
        depths: Tensor,
        generator: torch.Generator | None = None,
        backprop_loops: int = 0,
    ) -> tuple[Tensor, LoopProbe]:
        """:meth:`forward_at_depths`'s logits, and a :class:`LoopProbe` of each row's state at its last depth
        (with gradient), for a regulariser of the loop at the states training supervises."""
        return at_depths(self, tokens, valid, depths, generator, backprop_loops, probe=True)


def _is_identity(index: Tensor) -> bool:
    """Whether a [N] long index is 0, 1, ..., N − 1."""
    return bool((index == torch.arange(len(index), device=index.device)).all())


def _select_rows(x: Tensor, index: Tensor) -> Tensor:
    """x[index] along the batch; x itself when that is every row in order (no copy, no scatter in backward)."""
    return x if len(index) == len(x) and _is_identity(index) else x[index]


def _concat(tensors: list[Tensor]) -> Tensor:
    """torch.cat along the batch; a lone tensor as it is."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
