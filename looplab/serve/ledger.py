"""The engine's KV memory ledger: one limit (``looplab serve --kv-memory``) on the bytes the running groups'
keys and values may take together.

Continuous and depth groups keep theirs in the runner's paged pool (:mod:`looplab.serve.pager`), which grows
within what the other groups leave free and whose bytes the runner reports each step (none while no paged group
runs: an idle pool's memory is the ledger's, its blocks kept until that memory is given away). Any other group's
caches are allocated for its rows and slots when it is made (rows a later job joins included), so the ledger
reserves its bytes whole at its making and frees them when its last job ends. A job that does not fit now waits
in the queue, at its place, until running groups end (or, paged, is preempted and recomputed later). A job that
could not fit even alone is refused when it is submitted (:class:`~looplab.serve.scheduler.NeverFits`: HTTP 400
naming the limit). Sizes are :func:`~looplab.generation.budget.generation_bytes`' upper bounds, or
:func:`paged_bytes`' blocks. The ledger is the scheduler's: it reserves a group when it plans it, and counts the
pool's and the kept prefixes' bytes as the runner reports them.
"""

from __future__ import annotations

from looplab.errors import LooplabError
from looplab.generation.budget import generation_bytes
from looplab.generation.cache import kv_shape
from looplab.generation.paged import BLOCK_SLOTS, RESERVED_BLOCKS
from looplab.generation.views import decodable
from looplab.memory import GIB, device_bytes

__all__ = [
    "DoesNotFit",
    "KVLedger",
    "block_bytes",
    "default_kv_memory",
    "group_bytes",
    "job_blocks_bytes",
    "job_bytes",
    "paged_bytes",
    "paged_job_bytes",
    "sized_rows",
]


class DoesNotFit(LooplabError):
    """A group would take more KV memory than is free now (the engine puts its jobs back in the queue)."""


def group_bytes(model, jobs, rows: int, width: int, columns: int, cap: int, cache: str | None = None) -> int:
    """Bytes a group of ``rows`` rows for ``jobs`` (one cohort) holds at ``width`` prompt slots, ``columns``
    new-token slots and loop cap ``cap``, under the jobs' cache policy or ``cache`` (with its defaults)."""
    options = jobs[0].options
    view = decodable(model, gated=options.exit_rule.needs_gate)
    policy, params = (options.cache, options.cache_params) if cache is None else (cache, None)
    return generation_bytes(view, rows, width, columns, cap, policy, params)


def paged_bytes(model, options, slots: int, cap: int) -> int:
    """Bytes of the pool blocks a job decoded with ``options`` holds with ``slots`` slots written (from a block's
    start) at loop cap ``cap``: a block of :data:`~looplab.generation.paged.BLOCK_SLOTS` slots for each layer
    call its cache pages — the prelude's, the coda's and the core's at each loop to ``cap`` (one store across
    loops but per-loop), as :meth:`KVCache.reserve <looplab.generation.cache.KVCache.reserve>` takes them
    (under ``last_m``, whose core rings stay dense, one core store stands for them)."""
    view = decodable(model, gated=options.exit_rule.needs_gate)
    loops = cap if options.policy.per_loop else 1
    calls = len(view.prelude) + len(view.coda) + loops * len(view.core)
    return -(-slots // BLOCK_SLOTS) * calls * block_bytes(view)


def block_bytes(model) -> int:
    """Bytes of one pool block (one layer call's keys and values of BLOCK_SLOTS slots)."""
    heads, head_dim, dtype = kv_shape(model)
    return 2 * heads * BLOCK_SLOTS * head_dim * dtype.itemsize


def paged_job_bytes(model, job) -> int:
    """Bytes a pool must hold to decode ``job`` alone, wherever its group puts its new tokens: its prompt's
    blocks, those of its new tokens from any slot of a block on (a group writes every row's new token in one
    column), at its loop cap, and the pool's null block and sink."""
    return job_blocks_bytes(model, job, job.max_new) + RESERVED_BLOCKS * block_bytes(model)


def job_blocks_bytes(model, job, new: int) -> int:
    """Bytes of the pool blocks ``job``'s prompt and ``new`` of its new tokens take at its loop cap, those from
    any slot of a block on (a group writes every row's new token in one column)."""
    options, loops = job.options, job.options.exit_rule.loops
    tokens = paged_bytes(model, options, new + BLOCK_SLOTS - 1, loops) if new else 0
    return paged_bytes(model, options, len(job.prompt), loops) + tokens


def job_bytes(model, job) -> int:
    """Bytes ``job`` alone holds: its own prompt, budget and loop cap in a group of one row."""
    return group_bytes(model, [job], 1, len(job.prompt), job.max_new, job.options.exit_rule.loops)


def sized_rows(needed, capacity: int, least: int, memory: int | None) -> tuple[int, int]:
    """(rows, bytes) of a group of ``capacity`` rows, halved (down to ``least``, its first jobs' rows) until its
    bytes ``needed(rows)`` fit ``memory`` (None: no bound), leaving room for other groups;
    :class:`DoesNotFit` when ``least`` rows do not fit."""
    while memory is not None and capacity > least and needed(capacity) > memory:
        capacity = max(least, capacity // 2)
    nbytes = needed(capacity)
    if memory is not None and nbytes > memory:
        raise DoesNotFit(f"{least} rows need {nbytes:,} bytes of KV memory, {memory:,} are free")
    return capacity, nbytes


def default_kv_memory(model) -> int:
    """Half of what the device holds beside the model's weights."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(0, device_bytes(str(model.head.weight.device)) - weights) // 2


class KVLedger:
    """The bytes reserved by running unpaged groups (by the scheduler's group ids), and held by the paged pool
    and kept prefixes (as the runner last reported them), against ``limit``. Its totals are plain numbers,
    read from other threads (``/metrics``) while the engine's thread changes them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.groups: dict[int, int] = {}
        self.held_by_groups = 0
        self.prefixes = 0
        self.pool = 0

    @property
    def reserved(self) -> int:
        return self.held_by_groups + self.pool + self.prefixes

    @property
    def free(self) -> int:
        return self.limit - self.reserved

    def reserve(self, group: int, nbytes: int) -> None:
        """Hold ``nbytes`` for group ``group`` (:meth:`release` gives them back)."""
        self.groups[group] = nbytes
        self.held_by_groups += nbytes

    def release(self, group: int) -> None:
        self.held_by_groups -= self.groups.pop(group, 0)

    def describe(self) -> str:
        return f"{self.limit / GIB:,.3g} GiB"
