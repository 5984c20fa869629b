"""The attention of new tokens over a layer call's cache: their projections (:func:`project`, with RoPE:
:func:`rotate`), the cache written and read (:func:`cached_heads`), the heads' outputs (:func:`attention_heads`)
and the output projection (:func:`output`), kept apart so that a pass of several parts
(:class:`looplab.generation.passes.Fused`) projects all its tokens at once and attends part by part.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from looplab.generation.stores import LayerCache, RingLayerCache
from looplab.model.attention import SelfAttention, apply_rope

__all__ = ["attention_heads", "cached_heads", "output", "project", "rotate"]


def cached_heads(
    attn: SelfAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor | slice,
    chunk: slice,
    cache: LayerCache | RingLayerCache,
    allowed: Tensor,
    rope: tuple[Tensor, Tensor] | None,
    loop: int = 0,
    keep: Tensor | None = None,
) -> Tensor:
    """Self-attention of new tokens over the cache, writing their keys and values first, up to the heads'
    outputs (the output projection is the caller's: a pass of several parts runs it once for all of them,
    :class:`looplab.generation.passes.Fused`).

    Args:
        q, k, v: [R, H, m, Dh], [R, H_kv, m, Dh] the projections (:func:`project`, before RoPE) of the new
            tokens of ``rows`` (R row indices into the batch, or ``slice(None)`` for every row), which occupy
            slots ``chunk`` (m slots).
        cache: this layer call's keys and values (:class:`LayerCache` [B, H_kv, S, Dh], or a
            ``last_m`` :class:`RingLayerCache`).
        allowed: [R, m, chunk.stop] bool, from :func:`visible`.
        rope: (cos, sin) [R, m, Dh] for the new tokens' own positions, or None.
        loop: the core loop these tokens are at (what a ``last_m`` cache reads; 0 elsewhere).
        keep: [R] bool, or None for every row: the rows whose keys and values are written (a
            :class:`LayerCache`'s rows outside it keep their entries, and attend to them).

    Returns:
        [R, m, H·Dh]: the heads' concatenated outputs.
    """
    q, k = rotate(q, k, rope)
    if keep is not None:
        written, (k_held, v_held) = keep[:, None, None, None], cache.entries(rows, chunk)
        k, v = torch.where(written, k, k_held), torch.where(written, v, v_held)
    cache.write(rows, chunk, k, v, loop)
    keys, values = cache.read(rows, chunk, loop)
    return attention_heads(attn, q, keys, values, allowed)


def rotate(q: Tensor, k: Tensor, rope: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """q [R, H, m, Dh] and k [R, H_kv, m, Dh] after RoPE (cos, sin) [R, m, Dh], when given."""
    if rope is None:
        return q, k
    cos, sin = (t[:, None] for t in rope)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def attention_heads(attn, q: Tensor, keys: Tensor, values: Tensor, allowed: Tensor) -> Tensor:
    """The heads' concatenated outputs [R, m, H·Dh] for queries q [R, H, m, Dh] over keys and values
    [R, H_kv, S', Dh], where ``allowed`` [R, m, S'] lets them look (before the output projection)."""
    count, _, width, _ = q.shape
    if keys.shape[1] != q.shape[1]:  # grouped-query attention: each key/value head serves a group of heads
        groups = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    if q.dtype in (torch.bfloat16, torch.float16):
        # the same dot products in either order, on any device; this one because a half-precision product with
        # a transposed slice of the cache leaves oneDNN's fast path on a CPU (measured: 6× slower at 512 keys
        # and one query, bf16), and one with the slice as it is does not
        scores = (keys @ q.transpose(-1, -2)).transpose(-1, -2)
    else:
        scores = q @ keys.transpose(-1, -2)
    # a transformers attention says its own scale (head_dim ** -0.5 for every family taken so far)
    scores = scores / math.sqrt(q.shape[-1]) if isinstance(attn, SelfAttention) else scores * attn.scaling
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    y = scores.softmax(dim=-1) @ values
    return y.transpose(1, 2).reshape(count, width, -1)


def project(attn, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q [R, H, m, Dh] and k, v [R, H_kv, m, Dh] of new tokens x [R, m, d]: from the attention's own
    ``project_heads`` where it has one (Huginn's), from looplab's fused ``qkv``, or from a transformers
    attention's ``q_proj``, ``k_proj``, ``v_proj`` (H_kv ≤ H heads of keys and values), with its per-head
    ``q_norm`` / ``k_norm`` where it has them (Qwen3: per head; OLMo-2: over every head's projection), before
    RoPE as there."""
    count, width, _ = x.shape
    if hasattr(attn, "project_heads"):  # a family's own attention (Huginn's fused, biased, de-interleaved heads)
        return attn.project_heads(x)
    if isinstance(attn, SelfAttention):
        qkv = attn.qkv(x).view(count, width, 3, attn.n_heads, -1).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)
    head_dim = attn.head_dim
    q, k, v = (proj(x) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    whole = getattr(attn, "q_norm", None) is not None and attn.q_norm.weight.shape[-1] != head_dim
    if whole:  # OLMo-2's norms span every head's projection
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = (t.view(count, width, -1, head_dim) for t in (q, k, v))
    if getattr(attn, "q_norm", None) is not None and not whole:  # Qwen3's: one norm per head
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def output(attn, y: Tensor, x: Tensor) -> Tensor:
    """The attention's output projection of the heads' concatenated outputs y [R, m, H·Dh], after the
    sigmoid gate of the attention's input x [R, m, d] where the attention has one (HRM-Text's ``gate_proj``)."""
    if isinstance(attn, SelfAttention):
        return attn.out(y)
    if hasattr(attn, "merge_heads"):
        return attn.merge_heads(y)
    if getattr(attn, "gate_proj", None) is not None:
        y = torch.sigmoid(attn.gate_proj(x)) * y
    return attn.o_proj(y)
