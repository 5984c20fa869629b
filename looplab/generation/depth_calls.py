"""The layer calls of one depth-wise pass (:mod:`looplab.generation.depthwise`): one new token per row, each at
its own slot and core loop, its attention writing and reading its keys and values there.

Dense, a core layer's keys and values of every loop are one stack [K, B, H_kv, S, Dh], read and written by
slices when every row is at one slot and loop (``lockstep``), else by gathers and scatters at each token's
(loop, row, slot); paged, a core layer's block tables of every loop are one tensor [K, B, n] indexed the same
way, every call gathering the rows' blocks from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from looplab.generation.cached_attention import attention_heads, rotate
from looplab.generation.passes import chain_layer

__all__ = ["DepthCalls"]


@dataclass
class DepthCalls:
    """The layer calls of one depth-wise pass: one new token per row of ``rows`` [R] in its own ``slot`` [R],
    at core ``loop`` [R] (None outside the core); ``allowed`` [R, 1, S'] and ``rope`` as in
    :class:`looplab.generation.passes.Calls`. ``lockstep`` (slot, loop) when every row of a dense batch is at
    one slot and loop (then the caches are read and written by slices); else for the core ``writes``, the
    (pair → row of x, loop index, batch row, slot) indices of each token's loop and the later ones, and the
    loop each row reads, ``read`` [R]: its own, or its cap for a row that reads as ``shared`` does."""

    decoder: Any  # the DepthwiseDecoder (looplab.generation.depthwise, which imports this module)
    site: str
    rows: Tensor
    slot: Tensor
    loop: Tensor | None
    allowed: Tensor
    rope: tuple[Tensor, Tensor] | None
    lockstep: tuple[int, int] | None
    writes: tuple[Tensor, Tensor, Tensor, Tensor] | None
    read: Tensor | None = None

    def layer(self, index: int, layer, x: Tensor) -> Tensor:
        """Layer call ``index`` on the new tokens x [R, 1, d], its attention reading each row at its loop."""
        return chain_layer(self, index, layer, x)

    def heads(self, index: int, attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Layer call ``index``'s attention heads [R, 1, H·Dh] for the new tokens' projections q, k, v (before
        RoPE): over the pool's blocks (:meth:`paged_heads`) or the dense caches (:meth:`dense_heads`)."""
        cache = self.decoder.cache
        q, k = rotate(q, k, self.rope)
        if cache.pool is not None:
            store = cache.layer(self.site, 0, index) if self.loop is None else cache.blocks.core_tables.get(index)
            if store is None:
                raise ValueError("depth-wise batching pages core calls of the pool's shape only")
            return self.paged_heads(attn, q, k, v, store)
        entry = cache.layer(self.site, 0, index) if self.loop is None else None
        stores = (entry.k, entry.v) if entry is not None else self.decoder.stacks[index]
        return self.dense_heads(attn, q, k, v, *stores)

    def paged_heads(self, attn, q: Tensor, k: Tensor, v: Tensor, store) -> Tensor:
        """:meth:`dense_heads` over the pool's blocks: ``store`` a prelude or coda call's
        :class:`~looplab.generation.paged.PagedLayerCache`, or a core call's tables of every loop [K, B, n]."""
        stop, pool = self.allowed.shape[-1], self.decoder.cache.pool
        if self.loop is None:
            store.write_at(self.rows, self.slot, k, v)
            keys, values = pool.read(store.table[self.rows], stop)
        else:
            which, loops, rows, slots = self.writes
            pool.put(store[loops, rows, slots // pool.slots], slots % pool.slots, k[which, :, 0], v[which, :, 0])
            keys, values = pool.read(store[self.read - 1, self.rows], stop)
        return attention_heads(attn, q, keys, values, self.allowed)

    def dense_heads(self, attn, q: Tensor, k: Tensor, v: Tensor, k_store: Tensor, v_store: Tensor) -> Tensor:
        """Attention heads of the new tokens (q [R, H, 1, Dh], k, v after RoPE) over their rows' slots, after
        writing their keys and values: into [B, H, S, Dh] at its slot, or into [K, B, H, S, Dh] at its slot for
        its loop and every later one."""
        stop = self.allowed.shape[-1]
        if self.lockstep is not None:
            slot, loop = self.lockstep
            if self.loop is not None:  # this loop and, lent until they are run, the later ones
                k_store, v_store = k_store[loop - 1 :], v_store[loop - 1 :]
            k_store[..., slot, :] = k[:, :, 0]
            v_store[..., slot, :] = v[:, :, 0]
            keys, values = k_store[..., :stop, :], v_store[..., :stop, :]
            if self.loop is not None:
                keys, values = keys[0], values[0]
        elif self.loop is None:
            k_store[self.rows, :, self.slot] = k[:, :, 0]
            v_store[self.rows, :, self.slot] = v[:, :, 0]
            keys, values = k_store[self.rows, :, :stop], v_store[self.rows, :, :stop]
        else:
            which, loops, rows, slots = self.writes
            k_store[loops, rows, :, slots] = k[which, :, 0]
            v_store[loops, rows, :, slots] = v[which, :, 0]
            keys, values = k_store[self.read - 1, self.rows, :, :stop], v_store[self.read - 1, self.rows, :, :stop]
        return attention_heads(attn, q, keys, values, self.allowed)
