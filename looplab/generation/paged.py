"""Paged keys and values: one pool of fixed-size blocks that every cache drawing on it shares, each layer call
of each row addressing its slots through a block table (as vLLM pages its KV cache).

A :class:`BlockPool` holds k and v [N, H, b, Dh]: N blocks of ``b`` slots of one layer call, in the model's
shape and dtype. Blocks 0 and 1 are never handed out. A table entry no block was taken for points at block 0
(zeros, never written): a read of slots a row holds no block for gathers zeros that its mask hides, as the
unwritten slots of a dense cache are. A write there goes to block 1 instead, never read: a row takes blocks
only for its real slots, and a forward pass over several rows' prompts also runs (and writes) the padding
after the shorter ones.

A :class:`PagedLayerCache` is one layer call's store (the contract of :mod:`looplab.generation.stores`)
whose ``table`` [B, ⌈S/b⌉] long maps each row's slot block to a pool block. The
:class:`~looplab.generation.cache.KVCache` that owns the tables takes blocks for every layer call of a row
at once (:meth:`~looplab.generation.cache.KVCache.reserve`), before a forward pass writes there, and gives
them back when the row is released: a row holds blocks only for the slots it has written, not for the
longest sequence its batch may reach. A read gathers the row's blocks into one [R, H, S', Dh] tensor, in one copy
(a dense cache's read of some of its rows copies them too; of every row in order it is a view); the values
read are the dense cache's, so attention over them computes the same floats.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.errors import LooplabError

__all__ = ["BlockPool", "PagedLayerCache", "PoolFull", "BLOCK_SLOTS", "RESERVED_BLOCKS"]

#: slots a block holds (the prefix store's block too: a kept prefix is whole blocks)
BLOCK_SLOTS = 16
#: the blocks a pool never hands out: the null block 0 (what unheld slots read) and the sink 1 (where writes
#: to unheld slots go)
NULL, SINK = 0, 1
RESERVED_BLOCKS = 2


class PoolFull(LooplabError):
    """The pool has fewer free blocks than were asked for (the engine preempts a job, or waits)."""


class BlockPool:
    """``blocks`` blocks of ``slots`` slots of keys and values of ``heads`` × ``head_dim`` in ``dtype``; blocks 0
    and 1 are the null block and the sink. The pool grows (:meth:`grow`) up to what its owner's memory allows;
    blocks are taken and given back by id."""

    def __init__(
        self,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device,
        blocks: int = RESERVED_BLOCKS,
        slots: int = BLOCK_SLOTS,
    ):
        self.slots, self.heads, self.head_dim = slots, heads, head_dim
        shape = (max(RESERVED_BLOCKS, blocks), heads, slots, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        #: [1, H, 1] the head index a gather of whole blocks pairs with each block (PagedLayerCache.read)
        self.head_index = torch.arange(heads, device=self.k.device)[None, :, None]
        self.free_ids = list(range(self.capacity - 1, RESERVED_BLOCKS - 1, -1))  # taken from the end: lowest first
        #: the gathers' buffers, by store (:meth:`gather`)
        self.buffers: dict[str, Tensor] = {}

    @property
    def capacity(self) -> int:
        """Blocks the pool holds, the null block and the sink included."""
        return self.k.shape[0]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block's keys and values."""
        return 2 * self.heads * self.slots * self.head_dim * self.k.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds, its free blocks, the null block and the sink included."""
        return self.capacity * self.block_bytes

    @property
    def free(self) -> int:
        """Blocks free to take."""
        return len(self.free_ids)

    @property
    def used(self) -> int:
        """Blocks taken."""
        return self.capacity - RESERVED_BLOCKS - self.free

    def grow(self, capacity: int) -> None:
        """Hold ``capacity`` blocks (more than now): the new ones free, the old ones where they were. A pool none of
        whose blocks is taken lets them go before it makes the new ones (the two are never held at once: a pool
        kept idle between bursts is grown within the memory that held it); when that fails it stands at its
        reserved blocks, to be grown again."""
        old = self.capacity
        if capacity <= old:
            return
        if self.used == 0:
            shape = (capacity, *self.k.shape[1:])
            self.k = self.k.new_zeros((RESERVED_BLOCKS, *shape[1:]))
            self.v, self.free_ids = torch.zeros_like(self.k), []
            k = self.k.new_zeros(shape)  # (failing, the pool stands at its reserved blocks, none free)
            v = torch.zeros_like(k)
            self.k, self.v = k, v
            self.free_ids = list(range(capacity - 1, RESERVED_BLOCKS - 1, -1))
            return
        extra = (capacity - old, *self.k.shape[1:])
        self.k = torch.cat([self.k, self.k.new_zeros(extra)])
        self.v = torch.cat([self.v, self.v.new_zeros(extra)])
        self.free_ids = list(range(capacity - 1, old - 1, -1)) + self.free_ids

    def take(self, count: int) -> Tensor:
        """[count] long: ids of free blocks, now taken; :class:`PoolFull` when fewer are free."""
        if count > len(self.free_ids):
            raise PoolFull(
                f"{count} KV blocks asked for, {len(self.free_ids)} free of {self.capacity - RESERVED_BLOCKS}"
            )
        taken = self.free_ids[len(self.free_ids) - count :]
        del self.free_ids[len(self.free_ids) - count :]
        return torch.tensor(taken[::-1], dtype=torch.long, device=self.k.device)

    def gather(self, store: str, pieces: Tensor) -> Tensor:
        """[P, b·Dh] the (block, head) ``pieces`` [P] of ``store`` (``k`` or ``v``) seen as [N·H, b·Dh], copied into
        a buffer the pool keeps for the next gather of that store (a fresh tensor of a long context's keys each
        layer call is allocated and faulted in anew: measured 5× the copy itself at the Ouro-1.4B shape). What it
        returns is overwritten by the next gather: a layer call attends with it before the next one reads."""
        source = getattr(self, store)
        width = self.slots * self.head_dim
        buffer = self.buffers.get(store)
        if buffer is None or len(buffer) < len(pieces):
            buffer = self.buffers[store] = source.new_empty(len(pieces), width)
        return torch.index_select(source.view(-1, width), 0, pieces, out=buffer[: len(pieces)])

    def put(self, blocks: Tensor, offsets: Tensor | int, k: Tensor, v: Tensor) -> None:
        """Write k, v [P, H, Dh] at slot ``offsets`` ([P], or one for all) of ``blocks`` [P] (a table entry no block
        was taken for: the sink)."""
        blocks = blocks.masked_fill(blocks == NULL, SINK)
        self.k[blocks, :, offsets] = k
        self.v[blocks, :, offsets] = v

    def read(self, blocks: Tensor, stop: int) -> tuple[Tensor, Tensor]:
        """Keys and values [R, H, stop, Dh] of slots 0..stop − 1 of rows whose slot blocks are ``blocks`` [R, n]
        (n ≥ ⌈stop/b⌉), gathered in one copy laid out as a dense cache's (rows, heads, slots)."""
        blocks = blocks[:, : -(-stop // self.slots)]
        count, width = blocks.shape
        # the pool's (block, head) pieces of b slots in the order [R, H, n]: one index_select of the pool seen as
        # [N·H, b·Dh] (measured: the fastest of the gathers tried)
        pieces = (blocks[:, None, :] * self.heads + self.head_index).view(-1)
        shape = (count, self.heads, width * self.slots, self.head_dim)
        return tuple(self.gather(store, pieces).view(shape)[:, :, :stop] for store in ("k", "v"))

    def give(self, ids: Tensor) -> None:
        """Give back the blocks ``ids`` [n] (their contents stay until another taker writes them)."""
        self.free_ids.extend(ids.tolist())


class PagedLayerCache:
    """One layer call's keys and values in ``pool``'s blocks, row b's slot block j at block ``table[b, j]``
    (0: none taken, read as zeros, written to the sink; the owning cache takes blocks for a row's real slots
    before anything is written there)."""

    def __init__(self, pool: BlockPool, table: Tensor):
        self.pool, self.table = pool, table

    def _where(self, rows: Tensor | slice, chunk: slice) -> tuple[Tensor, Tensor]:
        """The blocks [R, m] and offsets [m] of slots ``chunk`` of ``rows``."""
        slots = torch.arange(chunk.start, chunk.stop, device=self.table.device)
        return self.table[rows][:, slots // self.pool.slots], slots % self.pool.slots

    def entries(self, rows: Tensor | slice, chunk: slice) -> tuple[Tensor, Tensor]:
        """The keys and values [R, H, m, Dh] slots ``chunk`` of ``rows`` hold now."""
        blocks, offsets = self._where(rows, chunk)
        return self.pool.k[blocks, :, offsets].transpose(1, 2), self.pool.v[blocks, :, offsets].transpose(1, 2)

    def write(self, rows: Tensor | slice, chunk: slice, k: Tensor, v: Tensor, loop: int) -> None:
        """Store the new tokens' k, v [R, H, m, Dh] in slots ``chunk`` of ``rows``."""
        if chunk.stop - chunk.start == 1:  # a decode step's one slot: one block a row, one offset
            blocks, offset = self.table[rows, chunk.start // self.pool.slots], chunk.start % self.pool.slots
            self.pool.put(blocks, offset, k[:, :, 0], v[:, :, 0])
            return
        blocks, offsets = self._where(rows, chunk)
        blocks = blocks.masked_fill(blocks == NULL, SINK)
        self.pool.k[blocks, :, offsets] = k.transpose(1, 2)
        self.pool.v[blocks, :, offsets] = v.transpose(1, 2)

    def write_at(self, rows: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Store one new token's k, v [R, H, 1, Dh] of each of ``rows`` [R] in its own slot ``slots`` [R]."""
        size = self.pool.slots
        self.pool.put(self.table[rows, slots // size], slots % size, k[:, :, 0], v[:, :, 0])

    def read(self, rows: Tensor | slice, chunk: slice, loop: int) -> tuple[Tensor, Tensor]:
        """Keys and values [R, H, chunk.stop, Dh] of slots 0..chunk.stop − 1 of ``rows``, gathered from their
        blocks in one copy laid out as a dense cache's (rows, heads, slots)."""
        return self.pool.read(self.table[rows], chunk.stop)

    def copy_slots(self, source: PagedLayerCache, rows: Tensor, chunk: slice) -> None:
        """Take ``source``'s entries of slots ``chunk`` of ``rows`` (a ``per_loop`` lend)."""
        k, v = source.entries(rows, chunk)
        self.write(rows, chunk, k, v, 0)

    def nbytes(self) -> int:
        """Bytes of the blocks this call's rows hold (a block two calls share counted in each)."""
        return int((self.table > 0).sum()) * self.pool.block_bytes
