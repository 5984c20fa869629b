"""Key/value caches of a looped transformer during generation, and the attention that reads them.

Every layer call of the model (prelude layer i, core layer ℓ at loop t, coda
layer i) has keys and values for the tokens already processed. A **policy**
says which of them a new token attends to (docs/methods.md §9):

    per_loop   one cache per (loop, core layer): a token at loop t reads every
               earlier token's loop-t keys and values — exactly what recomputing
               the whole sequence computes. A token that exited at depth k < t
               lends its loop-k entries to loops t > k. Memory grows with depth.
    shared     one cache per core layer across loops: each token's slot holds
               the keys and values of the last loop it ran, so an earlier token is
               read at its exit depth at every loop (Huginn's cache). Memory does
               not grow with depth.

Prelude and coda layers run once per token, so they have one cache each under
both policies.

A cache is preallocated for the batch's longest sequence: ``slots`` positions per
row, slot s holding the row's token s (prompts right-padded to the longest, then
the generated tokens, one slot per step for every row). Padding slots are never
attended; a row's RoPE or learned positions are its own token count, not slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.model.attention import SelfAttention, apply_rope

POLICIES = ("per_loop", "shared")


@dataclass
class LayerCache:
    """Keys and values of one layer call: k, v [B, H, S, Dh]; what was written is tracked by the owner."""

    k: Tensor
    v: Tensor


@dataclass
class Slots:
    """Where each row's tokens sit: ``positions`` [B, S] long (the token's index in its own row),
    ``real`` [B, S] bool (a token, not prompt padding), ``filled`` the number of slots in use."""

    positions: Tensor
    real: Tensor
    filled: int = 0


@dataclass
class KVCache:
    """Every layer call's :class:`LayerCache` under one policy, created on first use.

    Keys are (site, loop, index): site ``prelude``, ``core`` or ``coda``; loop 0 for the
    prelude and coda, and for the core under ``shared``.
    """

    policy: str
    batch: int
    heads: int
    head_dim: int
    slots: Slots
    dtype: torch.dtype
    device: torch.device
    layers: dict[tuple[str, int, int], LayerCache] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise LooplabError(f"unknown KV cache policy {self.policy!r}; valid choices: {', '.join(POLICIES)}")

    def key(self, site: str, loop: int, index: int) -> tuple[str, int, int]:
        return (site, loop if site == "core" and self.policy == "per_loop" else 0, index)

    def layer(self, site: str, loop: int, index: int) -> LayerCache:
        key = self.key(site, loop, index)
        if key not in self.layers:
            shape = (self.batch, self.heads, self.slots.positions.shape[1], self.head_dim)
            zeros = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.layers[key] = LayerCache(zeros, zeros.clone())
        return self.layers[key]

    def lend(self, rows: Tensor, chunk: slice, exit_loop: int, last_loop: int, layers: int) -> None:
        """``per_loop``: rows that stopped at ``exit_loop`` lend its entries to the loops up to ``last_loop``."""
        if self.policy != "per_loop":
            return
        for index in range(layers):
            source = self.layer("core", exit_loop, index)
            for loop in range(exit_loop + 1, last_loop + 1):
                target = self.layer("core", loop, index)
                target.k[rows, :, chunk] = source.k[rows, :, chunk]
                target.v[rows, :, chunk] = source.v[rows, :, chunk]

    def nbytes(self) -> int:
        """Bytes held by the keys and values."""
        return sum(c.k.numel() * c.k.element_size() * 2 for c in self.layers.values())


def visible(slots: Slots, rows: Tensor | slice, chunk: slice, window: int) -> Tensor:
    """[R, m, S'] bool: which slots 0..chunk.stop − 1 each new token of ``rows`` in ``chunk`` may attend to.

    Earlier or equal slots holding real tokens, within ``window`` positions when w > 0; a padding
    query sees itself.
    """
    device = slots.real.device
    query_slot = torch.arange(chunk.start, chunk.stop, device=device)
    key_slot = torch.arange(chunk.stop, device=device)
    allowed = (key_slot[None, :] <= query_slot[:, None])[None] & slots.real[rows, None, : chunk.stop]
    if window > 0:
        query_pos = slots.positions[rows, chunk][:, :, None]
        key_pos = slots.positions[rows, None, : chunk.stop]
        allowed = allowed & (query_pos - key_pos <= window)
    return allowed | (key_slot[None, None, :] == query_slot[None, :, None])


def cached_attention(
    attn: SelfAttention,
    x: Tensor,
    rows: Tensor | slice,
    chunk: slice,
    cache: LayerCache,
    allowed: Tensor,
    rope: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """Self-attention of new tokens over the cache, writing their keys and values first.

    Args:
        x: [R, m, d] the layer input of the new tokens of ``rows`` (R row indices into the batch,
            or ``slice(None)`` for every row), which occupy slots ``chunk`` (m slots).
        cache: this layer call's keys and values, [B, H, S, Dh].
        allowed: [R, m, chunk.stop] bool, from :func:`visible`.
        rope: (cos, sin) [R, m, Dh] for the new tokens' own positions, or None.

    Returns:
        [R, m, d]: the attention sublayer's output (before its residual).
    """
    count, width, d_model = x.shape
    qkv = attn.qkv(x).view(count, width, 3, attn.n_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    if rope is not None:
        cos, sin = (t[:, None] for t in rope)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    cache.k[rows, :, chunk] = k
    cache.v[rows, :, chunk] = v
    keys, values = cache.k[rows, :, : chunk.stop], cache.v[rows, :, : chunk.stop]
    scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    y = scores.softmax(dim=-1) @ values
    return attn.out(y.transpose(1, 2).reshape(count, width, d_model))
