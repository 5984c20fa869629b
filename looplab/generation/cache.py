"""Key/value caches of a looped transformer during generation (the attention that reads them:
:mod:`looplab.generation.cached_attention`).

Every layer call of the model (prelude layer i, core layer ℓ at loop t, coda
layer i) has keys and values for the tokens already processed. A **policy**
(:mod:`looplab.generation.policies`: ``per_loop``, ``shared``, ``last_m`` or a
plugin's) says which of them a new token attends to (docs/methods.md §9).

Prelude and coda layers run once per token, so they have one cache each under
every policy.

A layer call whose output also depends on earlier tokens through a short causal
convolution (Inkling-2's) keeps, beside its keys and values, the convolution's
inputs per slot (:class:`SlotStore`), under the same policy: the cache entries of
a call are what any part of it reads of earlier tokens.

A cache is laid out for the batch's longest sequence: ``slots`` positions per
row, slot s holding the row's token s (prompts right-padded to the longest, then
the generated tokens, one slot per step for every row). Padding slots are never
attended; a row's RoPE or learned positions are its own token count, not slots.
Each layer call's store is preallocated for them, or, once :meth:`KVCache.page`
is called, holds its keys and values in a shared pool's blocks taken as the
rows write their slots (:mod:`looplab.generation.paged`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from looplab.generation.block_tables import BlockTables
from looplab.generation.paged import BlockPool, PagedLayerCache
from looplab.generation.policies import POLICIES, cache_params
from looplab.generation.stores import LayerCache, RingLayerCache, SlotStore


def kv_shape(model) -> tuple[int, int, torch.dtype]:
    """(key/value heads, head dim, dtype) of the keys and values ``model``'s layer calls cache (a retrofit's
    grouped keys and values have fewer heads than its queries)."""
    cfg = model.cfg
    return (
        getattr(cfg, "kv_heads", cfg.n_heads),
        getattr(cfg, "head_dim", cfg.d_model // cfg.n_heads),
        model.head.weight.dtype,
    )


@dataclass
class Slots:
    """Where each row's tokens sit: ``positions`` [B, S] long (the token's index in its own row),
    ``real`` [B, S] bool (a token, not prompt padding), ``filled`` the number of slots in use."""

    positions: Tensor
    real: Tensor
    filled: int = 0


@dataclass
class KVCache:
    """Every layer call's store under one policy, created on first use.

    Keys are (site, loop, index): site ``prelude``, ``core`` or ``coda``; loop 0 for the prelude and
    coda, and for the core under a policy with one store across loops (``shared``; ``last_m``'s is a
    :class:`RingLayerCache`). ``index`` numbers a site's layer calls in one pass (a loop that calls a
    layer twice has two indices); a convolution's :class:`SlotStore` is keyed (site, loop, (index, name)).
    ``params`` are the policy's own (a dict of its keys or its ``Params``).

    Under a per-loop policy with ``loops`` (the deepest loop a token may run) given, the keys and values of
    core call ``index`` at every loop are one tensor each, ``stacks[index]`` = (k, v) [K, B, H, S, Dh],
    and each loop's :class:`LayerCache` is a view of its slice: a lend is then one write per call
    instead of one per later loop, and depth-wise batching indexes the loop like any other dimension.

    A paged cache (:meth:`page`) keeps the calls it is told of in a :class:`~looplab.generation.paged.BlockPool`
    instead, through ``blocks`` (:class:`~looplab.generation.block_tables.BlockTables`: a table each, the
    blocks each row holds and takes; :meth:`assign`, :meth:`reserve`, :meth:`release`); other calls (another
    shape, another policy's store, a convolution's) stay dense.
    """

    policy: str
    batch: int
    heads: int
    head_dim: int
    slots: Slots
    dtype: torch.dtype
    device: torch.device
    params: Any = None
    loops: int = 0
    layers: dict[tuple, LayerCache | RingLayerCache | SlotStore | PagedLayerCache] = field(default_factory=dict)
    stacks: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    pool: BlockPool | None = None
    blocks: BlockTables | None = None

    def __post_init__(self) -> None:
        self.params = cache_params(self.policy, self.params)
        self.entry = POLICIES[self.policy]
        if self.loops:
            self.params = self.entry.at_cap(self.params, self.loops)

    def key(self, site: str, loop: int, index) -> tuple:
        return (site, loop if site == "core" and self.entry.per_loop else 0, index)

    def layer(self, site: str, loop: int, index: int, heads: int | None = None, head_dim: int | None = None):
        """Layer call ``index`` of ``site`` at ``loop``: its keys and values of ``heads`` × ``head_dim`` (default
        the model's; a family whose layers differ in shape gives each call's own)."""
        key = self.key(site, loop, index)
        if key not in self.layers:
            heads, head_dim = heads or self.heads, head_dim or self.head_dim
            shape = (self.batch, heads, self.slots.positions.shape[1], head_dim)
            paged = self.blocks is not None and key in self.blocks.tables
            if paged and (heads, head_dim) != (self.pool.heads, self.pool.head_dim):
                self.blocks.unpage(key)  # a call of its own shape stays dense
            if self.blocks is not None and key in self.blocks.tables:
                self.layers[key] = PagedLayerCache(self.pool, self.blocks.tables[key])
            elif site == "core" and self.entry.per_loop and self.loops and self.pool is None:
                k, v = self.stack(index, heads, head_dim)
                self.layers[key] = LayerCache(k[loop - 1], v[loop - 1])
            elif site == "core":
                self.layers[key] = self.entry.core_store(self.params, shape, self.dtype, self.device)
            else:
                self.layers[key] = LayerCache.zeros(shape, self.dtype, self.device)
        return self.layers[key]

    def stack(self, index: int, heads: int | None = None, head_dim: int | None = None) -> tuple[Tensor, Tensor]:
        """``per_loop`` with ``loops``: core call ``index``'s keys and values of every loop, [K, B, H, S, Dh] each
        (a dense cache's)."""
        if self.pool is not None:
            raise ValueError("a paged cache keeps no per-loop stacks")
        if index not in self.stacks:
            heads, head_dim = heads or self.heads, head_dim or self.head_dim
            shape = (self.loops, self.batch, heads, self.slots.positions.shape[1], head_dim)
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.stacks[index] = (k, torch.zeros_like(k))
        return self.stacks[index]

    def history(self, site: str, loop: int, index, channels: int, dtype: torch.dtype | None = None) -> SlotStore:
        """The :class:`SlotStore` of ``channels`` per slot (in ``dtype``, default the cache's) keyed ``index`` (a
        layer call and a name) at ``site``, ``loop``; the policy maps loops as for keys and values."""
        key = self.key(site, loop, index)
        if key not in self.layers:
            shape = (self.batch, self.slots.positions.shape[1], channels)
            self.layers[key] = SlotStore(torch.zeros(shape, dtype=dtype or self.dtype, device=self.device))
        return self.layers[key]

    def page(self, pool: BlockPool, prelude: int, core: int, coda: int) -> None:
        """Keep the keys and values of ``prelude`` prelude, ``core`` core (at every loop, under a per-loop
        policy) and ``coda`` coda layer calls in ``pool``'s blocks (the core's only under ``per_loop`` and
        ``shared``, whose stores are plain keys and values; with none of these the cache stays dense);
        nothing written yet."""
        loops = range(1, self.loops + 1) if self.entry.per_loop else [0]
        keys = [("prelude", 0, i) for i in range(prelude)] + [("coda", 0, i) for i in range(coda)]
        if self.entry.name in ("per_loop", "shared"):
            keys += [("core", t, i) for t in loops for i in range(core)]
        if not keys:  # nothing to page (another policy's core, no prelude or coda): the cache stays dense
            return
        self.pool = pool
        blocks = -(-self.slots.positions.shape[1] // pool.slots)
        self.blocks = BlockTables(pool, keys, self.batch, blocks, self.loops, self.entry.per_loop, self.device)

    def assign(self, rows: Tensor, loops: Tensor, shared: Tensor | None = None) -> None:
        """Rows ``rows`` [R], holding no blocks, take blocks in the per-loop core tables of loops 1..``loops`` [R]
        only, or, where ``shared`` [R] bool, keep one store across loops (:meth:`BlockTables.assign
        <looplab.generation.block_tables.BlockTables.assign>`). Nothing to do unpaged."""
        if self.blocks is not None:
            self.blocks.assign(rows, loops, shared)

    def shares_loops(self) -> bool:
        """Whether rows may keep one store across loops: paged under a per-loop policy, every core call paged."""
        return self.blocks is not None and self.blocks.shares_loops()

    @property
    def loop_shared(self) -> Tensor | None:
        """[B] bool: the rows keeping one store across loops (None unpaged)."""
        return None if self.blocks is None else self.blocks.loop_shared

    def blocks_for(self, lengths: list[int], loops: list[int], shared: list[bool]) -> int:
        """Pool blocks the prompts of ``lengths`` tokens of rows yet to be placed take, at their ``loops`` caps and
        ``shared`` (0 unpaged)."""
        return 0 if self.blocks is None else self.blocks.blocks_for(lengths, loops, shared)

    def blocks_needed(self, rows: Tensor, chunk: slice) -> int:
        """Pool blocks :meth:`reserve` would take for slots ``chunk`` of ``rows`` [R] (0 unpaged)."""
        return 0 if self.blocks is None else self.blocks.blocks_needed(rows, chunk, self.slots.real)

    def reserve(self, rows: Tensor, chunk: slice) -> None:
        """Take blocks for the slot blocks of ``chunk`` that hold real slots of ``rows`` [R] and no blocks yet, in
        every table each row takes blocks in, before anything is written there (nothing taken unpaged; padding
        is written to the pool's sink); :class:`~looplab.generation.paged.PoolFull`, with nothing taken, when
        the pool has too few free."""
        if self.blocks is not None:
            self.blocks.reserve(rows, chunk, self.slots.real)

    def blocks_needed_at(self, rows: Tensor, slots: Tensor) -> int:
        """Pool blocks :meth:`reserve_at` would take for one slot of each of ``rows`` [R], ``slots`` [R]."""
        return 0 if self.blocks is None else self.blocks.blocks_needed_at(rows, slots)

    def reserve_at(self, rows: Tensor, slots: Tensor) -> None:
        """:meth:`reserve` for one (real) slot of each of ``rows`` [R], ``slots`` [R] (each row's token in its own
        slot: depth-wise batching)."""
        if self.blocks is not None:
            self.blocks.reserve_at(rows, slots)

    def release(self, rows: Tensor) -> None:
        """Give the pool back every block ``rows`` [R] hold (their slots read as unwritten after)."""
        if self.blocks is not None:
            self.blocks.release(rows)

    def lend(self, rows: Tensor, chunk: slice, exit_loop: int, last_loop: int) -> None:
        """A per-loop policy: rows that stopped at ``exit_loop`` lend its entries — of every call site of the
        loop, keys, values and convolution inputs alike — to the loops up to ``last_loop``."""
        if not self.entry.per_loop:
            return
        if self.loop_shared is not None:  # a row sharing one store across loops has nothing to lend
            rows = rows[~self.loop_shared[rows]]
            if not len(rows):
                return
        for k, v in self.stacks.values():  # the exit loop's slice, broadcast over the later ones
            k[exit_loop:last_loop, rows, :, chunk] = k[exit_loop - 1, rows, :, chunk]
            v[exit_loop:last_loop, rows, :, chunk] = v[exit_loop - 1, rows, :, chunk]
        sources = [
            (key[2], entry)
            for key, entry in self.layers.items()
            if key[:2] == ("core", exit_loop) and not (isinstance(key[2], int) and key[2] in self.stacks)
        ]
        for index, source in sources:
            for loop in range(exit_loop + 1, last_loop + 1):
                key = ("core", loop, index)
                if self.blocks is not None and key in self.blocks.tables:
                    self.layer("core", loop, index)
                elif key not in self.layers:
                    self.layers[key] = source.empty_like()
                self.layers[key].copy_slots(source, rows, chunk)

    def slot_state(self, row: int, start: int, stop: int, loops: int) -> dict:
        """Copies of the keys and values row ``row`` holds in slots ``start``..``stop`` − 1 of every layer call
        (the core's at loops 1..``loops``): what :meth:`fill_slots` puts back. Under a per-loop cache whose calls
        each hold keys and values only (:meth:`slots_only`)."""
        state = {}
        for index, (k, v) in self.stacks.items():
            state["core", index] = (k[:loops, row, :, start:stop].clone(), v[:loops, row, :, start:stop].clone())
        rows, chunk = torch.tensor([row], device=self.device), slice(start, stop)
        for key, entry in self.layers.items():
            if key[0] != "core":  # a dense cache's core calls are views of the stacks
                state[key] = tuple(t[0].clone() for t in entry.entries(rows, chunk))
        if self.pool is not None:  # a paged cache's core calls, every loop's stacked as the stacks are
            for index in sorted({key[2] for key in self.blocks.tables if key[0] == "core"}):
                loop_entries = [self.layer("core", t, index).entries(rows, chunk) for t in range(1, loops + 1)]
                state["core", index] = tuple(torch.stack([pair[i][0] for pair in loop_entries]) for i in (0, 1))
        return state

    def fill_slots(self, rows: Tensor, start: int, state: dict) -> None:
        """Put ``state`` (a :meth:`slot_state`, or several of consecutive slots joined) into ``rows``' slots from
        ``start`` on."""
        if self.pool is not None:
            stop = start + next(iter(state.values()))[0].shape[-2]
            self.reserve(rows, slice(start, stop))
        for key, (k, v) in state.items():
            stop = start + k.shape[-2]
            if key[0] == "core" and self.pool is not None:
                for t in range(len(k)):
                    store = self.layer("core", t + 1, key[1])
                    store.write(
                        rows,
                        slice(start, stop),
                        k[t].expand(len(rows), -1, -1, -1),
                        v[t].expand(len(rows), -1, -1, -1),
                        0,
                    )
            elif key[0] == "core":
                k_store, v_store = self.stack(key[1])
                k_store[: len(k), rows, :, start:stop] = k[:, None]
                v_store[: len(v), rows, :, start:stop] = v[:, None]
            else:
                expand = (len(rows), -1, -1, -1)
                self.layer(*key).write(rows, slice(start, stop), k[None].expand(expand), v[None].expand(expand), 0)

    def slots_only(self) -> bool:
        """Whether every layer call's cache entry holds keys and values alone (what :meth:`slot_state` copies)."""
        plain = (LayerCache, PagedLayerCache)
        return self.entry.per_loop and all(isinstance(entry, plain) for entry in self.layers.values())

    def nbytes(self) -> int:
        """Bytes held by the keys and values (and convolution inputs)."""
        stacked = sum(2 * k.numel() * k.element_size() for k, _ in self.stacks.values())
        views = [key for key in self.layers if key[0] == "core" and isinstance(key[2], int) and key[2] in self.stacks]
        paged = {} if self.blocks is None else self.blocks.tables
        dense = sum(entry.nbytes() for key, entry in self.layers.items() if key not in views and key not in paged)
        return stacked + dense + (0 if self.blocks is None else self.blocks.nbytes())


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
