"""The block tables of a paged KV cache (:meth:`KVCache.page <looplab.generation.cache.KVCache.page>`): for each
layer call a table [B, ⌈S/b⌉] of the pool block holding each row's slot block, which slot blocks each row holds
blocks for, and how many blocks a row takes (:class:`BlockTables`).

A row takes blocks only for the slot blocks holding its real tokens (padding after a shorter prompt is written
to the pool's sink), in the prelude's and the coda's tables and, under a per-loop policy, in the core's of
loops 1 … its own cap (a token of the row never runs past it). A ``loop_shared`` row (a request for a
``shared`` cache in a batch of per-loop ones) takes loop 1's core blocks alone, and its tables at every later
loop point at them: one store across loops, which each loop overwrites, as a shared cache is. So a row's
prompt of n tokens takes ⌈n/16⌉ · (prelude + coda + c · core) blocks at cap c (one core store shared), what
the server's scheduler prices before admitting it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.generation.paged import BlockPool

__all__ = ["BlockTables"]


class BlockTables:
    """The tables of the layer calls ``keys`` ((site, loop, index), as :class:`~looplab.generation.cache.KVCache`
    keys its stores) of ``batch`` rows of ``blocks`` slot blocks in ``pool``, the core's at loops 1..``loops``
    under a ``per_loop`` policy (see the module docstring).

    Attributes:
        tables: each call's [B, n] long (0: no block taken: read as zeros, written to the sink).
        core_tables: a per-loop core call's tables of every loop, [K, B, n] (each loop's table a view of its
            slice: depth-wise batching indexes the loop like any other dimension).
        held [B, n] bool: the slot blocks each row holds blocks for; ``row_loops`` [B]: the core loops whose
            tables a row takes blocks in; ``loop_shared`` [B] bool: the rows keeping one store across loops.
        loop_tables: the tables by the loop whose rows take blocks in them: 1 (the prelude's, the coda's, the
            core's at loop 1 or, under a policy with one store across loops, its only one), t ≥ 2 (a per-loop
            core's at loop t).
        dense_core: a core call was kept dense (its shape is not the pool's: :meth:`unpage`).
    """

    def __init__(self, pool: BlockPool, keys: list[tuple], batch: int, blocks: int, loops: int, per_loop: bool, device):
        self.pool, self.per_loop, self.dense_core = pool, per_loop, False
        self.tables = {key: torch.zeros(batch, blocks, dtype=torch.long, device=device) for key in keys}
        self.core_tables: dict[int, Tensor] = {}
        for index in sorted({key[2] for key in keys if key[0] == "core"} if per_loop else ()):
            stack = torch.zeros(loops, batch, blocks, dtype=torch.long, device=device)
            self.core_tables[index] = stack
            self.tables.update({("core", t, index): stack[t - 1] for t in range(1, loops + 1)})
        self.held = torch.zeros(batch, blocks, dtype=torch.bool, device=device)
        self.row_loops = torch.full((batch,), max(1, loops), dtype=torch.long, device=device)
        self.loop_shared = torch.zeros(batch, dtype=torch.bool, device=device)
        self.loop_tables: dict[int, list[tuple]] = {}
        for key in keys:
            self.loop_tables.setdefault(max(1, key[1]) if key[0] == "core" else 1, []).append(key)

    def assign(self, rows: Tensor, loops: Tensor, shared: Tensor | None = None) -> None:
        """Rows ``rows`` [R], holding no blocks, take blocks in the per-loop core tables of loops 1..``loops`` [R]
        only (the deepest each runs), or, where ``shared`` [R] bool, in loop 1's alone (one store across
        loops)."""
        if bool(self.held[rows].any()):
            raise ValueError("a row is assigned its tables only while it holds no blocks")
        if shared is not None and bool(shared.any()) and not self.shares_loops():
            raise ValueError("rows share one store across loops only where every per-loop core call is paged")
        self.row_loops[rows] = loops
        self.loop_shared[rows] = False if shared is None else shared

    def shares_loops(self) -> bool:
        """Whether rows may keep one store across loops: a per-loop policy, no core call kept dense."""
        return self.per_loop and not self.dense_core

    def owns(self, loop: int, loops: Tensor, shared: Tensor) -> Tensor:
        """[R] bool: whether rows of ``loops`` [R] and ``shared`` [R] take blocks of their own in loop ``loop``'s
        tables (:attr:`loop_tables`)."""
        if loop == 1:
            return torch.ones_like(shared)
        return (loops >= loop) & ~shared

    def taken(self, loops: Tensor, shared: Tensor) -> Tensor:
        """[R] long: the tables a row of ``loops`` [R] and ``shared`` [R] takes a block in, for each slot block."""
        counts = torch.zeros_like(loops)
        for loop, keys in self.loop_tables.items():
            counts += len(keys) * self.owns(loop, loops, shared)
        return counts

    def blocks_for(self, lengths: list[int], loops: list[int], shared: list[bool]) -> int:
        """Blocks the prompts of ``lengths`` tokens of rows yet to be placed take, each row's of its loop cap and
        its sharing: what :meth:`reserve` takes for them once assigned (:meth:`assign`)."""
        if not lengths:
            return 0
        device = self.held.device
        blocks = -(-torch.tensor(lengths, device=device) // self.pool.slots)
        taken = self.taken(torch.tensor(loops, device=device), torch.tensor(shared, device=device))
        return int((blocks * taken).sum())

    def missing(self, rows: Tensor, chunk: slice, real: Tensor) -> tuple[Tensor, int]:
        """[R, n] bool: the slot blocks first..first + n − 1 that hold a real slot (``real`` [B, S] bool) of
        ``chunk`` of ``rows`` [R] and no block yet; and ``first``."""
        size = self.pool.slots
        first, last = chunk.start // size, -(-chunk.stop // size)
        if chunk.stop - chunk.start == 1:  # a decode step's one slot (the hot path: a few ops, not a padded view)
            return (real[rows, chunk.start] & ~self.held[rows, first])[:, None], first
        # the chunk's slots padded out to whole blocks (as unreal), so that each block's slots are one row of a view
        ahead, behind = chunk.start - first * size, last * size - chunk.stop
        padded = torch.nn.functional.pad(real[rows, chunk], (ahead, behind))
        return padded.view(len(rows), last - first, size).any(-1) & ~self.held[rows, first:last], first

    def blocks_needed(self, rows: Tensor, chunk: slice, real: Tensor) -> int:
        """Blocks :meth:`reserve` would take for slots ``chunk`` of ``rows`` [R]."""
        missing, _ = self.missing(rows, chunk, real)
        return int((missing.sum(1) * self.taken(self.row_loops[rows], self.loop_shared[rows])).sum())

    def reserve(self, rows: Tensor, chunk: slice, real: Tensor) -> None:
        """Take blocks for the slot blocks of ``chunk`` that hold real slots of ``rows`` [R] and no blocks yet;
        :class:`~looplab.generation.paged.PoolFull`, with nothing taken, when the pool has too few free."""
        missing, first = self.missing(rows, chunk, real)
        if missing.any():
            pairs = missing.nonzero(as_tuple=True)
            self._take((rows[pairs[0]], pairs[1] + first))

    def blocks_needed_at(self, rows: Tensor, slots: Tensor) -> int:
        """Blocks :meth:`reserve_at` would take for one slot of each of ``rows`` [R], ``slots`` [R]."""
        rows, _ = self._missing_at(rows, slots)
        return int(self.taken(self.row_loops[rows], self.loop_shared[rows]).sum())

    def reserve_at(self, rows: Tensor, slots: Tensor) -> None:
        """:meth:`reserve` for one slot of each of ``rows`` [R], ``slots`` [R] (each row's token in its own slot)."""
        where = self._missing_at(rows, slots)
        if len(where[0]):
            self._take(where)

    def _missing_at(self, rows: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """The (row, slot block) pairs [P] of ``rows`` [R] and their ``slots`` [R] that hold no block yet."""
        blocks = slots // self.pool.slots
        missing = ~self.held[rows, blocks]
        return rows[missing], blocks[missing]

    def _take(self, where: tuple[Tensor, Tensor]) -> None:
        """Take blocks for the (row, slot block) pairs ``where`` [P] in every table each row takes blocks in (a row
        keeping one store across loops: its later loops' tables point at loop 1's)."""
        loops, shared = self.row_loops[where[0]], self.loop_shared[where[0]]
        ids = self.pool.take(int(self.taken(loops, shared).sum()))
        start = 0
        for loop, keys in self.loop_tables.items():
            owns = self.owns(loop, loops, shared)
            mine = (where[0][owns], where[1][owns])
            count = len(mine[0]) * len(keys)
            for key, taken in zip(keys, ids[start : start + count].view(len(keys), -1)):
                self.tables[key][mine] = taken
            start += count
            if loop > 1 and bool(shared.any()):
                self._alias(keys, (where[0][shared], where[1][shared]))
        self.held[where] = True

    def _alias(self, keys: list[tuple], where: tuple[Tensor, Tensor]) -> None:
        """Point the (row, slot block) entries ``where`` of the later loops' core tables ``keys`` at loop 1's
        blocks: a row keeping one store across loops writes and reads them at every loop."""
        for key in keys:
            self.tables[key][where] = self.tables["core", 1, key[2]][where]

    def release(self, rows: Tensor) -> None:
        """Give the pool back every block ``rows`` [R] hold (their slots read as unwritten after)."""
        held = self.held[rows]
        loops, shared = self.row_loops[rows], self.loop_shared[rows]
        for loop, keys in self.loop_tables.items():
            owned = held & self.owns(loop, loops, shared)[:, None]
            for key in keys:
                self.pool.give(self.tables[key][rows][owned])
                self.tables[key][rows] = 0
        self.held[rows] = False

    def unpage(self, key: tuple) -> None:
        """Keep call ``key``'s keys and values out of the pool (a call of another shape than the pool's): the
        blocks its table holds go back."""
        if key[0] == "core" and bool(self.loop_shared.any()):
            raise ValueError("a per-loop core call kept dense cannot be shared across loops by some rows")
        self.dense_core = self.dense_core or key[0] == "core"
        loop = max(1, key[1]) if key[0] == "core" else 1
        owned = self.held & self.owns(loop, self.row_loops, self.loop_shared)[:, None]
        self.pool.give(self.tables.pop(key)[owned])
        if key[0] == "core":
            self.core_tables.pop(key[2], None)  # its loops' tables are no longer the pool's
        self.loop_tables[loop].remove(key)
        if not self.loop_tables[loop]:
            del self.loop_tables[loop]

    def nbytes(self) -> int:
        """Bytes of the blocks the rows hold (a block a row's loops share counted once)."""
        return int((self.held.sum(1) * self.taken(self.row_loops, self.loop_shared)).sum()) * self.pool.block_bytes
