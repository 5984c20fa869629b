"""The runner's paged KV pool and its preemption: every continuous and depth group keeps its keys and values in one
:class:`~looplab.generation.paged.BlockPool`, taking blocks as its rows write their slots.

The pool grows, up to the bytes the scheduler gives it each step (``--kv-memory`` less what unpaged groups
reserve), when a group needs more blocks than are free; kept prefixes give it their room. When no paged group
runs the pool is idle: its memory goes back to the scheduler's ledger, but its blocks are kept (all free) for
the next paged group, until a step's room no longer holds them beside the kept prefixes
(:meth:`Pager.fit_idle`). (Grown anew for each burst of requests, a pool at the Ouro-1.4B shape faulted in about
1 GB a burst of 8.) A job is admitted into a row only when its prompt's blocks can be had (:meth:`Pager.grant`);
otherwise it goes back to the queue. When a step's new tokens need blocks the pool cannot give, the most
recently admitted running job is preempted (:meth:`Pager.ensure`): its row and blocks are freed and it goes back
to the front of the queue; when it is admitted again it is recomputed — its prompt prefilled and its tokens so
far fed again, one a step, without being sent (:attr:`~looplab.serve.batch.Job.replay`) — so its answer is the
one it would have had (a token runs at the depth its exit gives it again, on the same inputs; a sampled job's
generator draws nothing while it replays).
"""

from __future__ import annotations

from collections.abc import Callable

from looplab.generation.paged import BlockPool, PoolFull
from looplab.serve.batch import Job
from looplab.serve.prefixes import PrefixStore

__all__ = ["Pager"]


class Pager:
    """The pool (made at the first paged group), its byte ``room``, the paged groups, and the jobs preempted
    this step (:attr:`preempted`, which the runner hands back to the scheduler)."""

    def __init__(self, prefixes: PrefixStore | None = None):
        #: the kept prefixes, which give the pool their room when it grows into it
        self.prefixes = prefixes
        self.pool: BlockPool | None = None
        self.room = 0
        self.groups: list = []
        self.preempted: list[Job] = []
        #: preemptions since the engine started
        self.count = 0

    @property
    def idle(self) -> bool:
        """Whether no paged group runs (every group gives its rows' blocks back when it ends)."""
        return not self.groups

    def fit_idle(self) -> None:
        """Let an idle pool go when this step's ``room`` (set first) no longer holds it beside the kept prefixes
        (the ledger gave its memory to unpaged groups or prefixes while it was idle); a pool kept takes its
        bytes out of the prefixes' room, as a pool that grows does."""
        if not self.idle or self.pool is None:
            return
        kept = 0 if self.prefixes is None else self.prefixes.nbytes
        # (a block still taken would be lost to every later group, unseen: the scheduler reads no idle pool)
        if self.pool.nbytes + kept > self.room or self.pool.used:
            self.pool = None
        elif self.prefixes is not None:
            self.prefixes.make_room(min(self.prefixes.room, self.room - self.pool.nbytes))

    def pool_for(self, heads: int, head_dim: int, dtype, device) -> BlockPool:
        """The pool, made in this shape the first time (one model: every group's calls share it)."""
        if self.pool is None:
            self.pool = BlockPool(heads, head_dim, dtype, device)
        return self.pool

    def growable(self) -> int:
        """Blocks the pool may still gain within its room."""
        if self.pool is None:
            return 0
        return max(0, self.room // self.pool.block_bytes - self.pool.capacity)

    def grant(self, blocks: int) -> bool:
        """Whether ``blocks`` more can be had now (the pool grown for them if need be); nothing is preempted."""
        pool = self.pool
        if blocks <= pool.free:
            return True
        if blocks > pool.free + self.growable():
            return False
        # at least double, so that a pool grown step by step copies its blocks O(log) times
        wanted = min(pool.capacity + self.growable(), max(2 * pool.capacity, pool.capacity + blocks - pool.free))
        try:
            pool.grow(wanted)
        except RuntimeError:  # the device cannot hold the grown pool beside the old one now: as if no room
            return False
        if self.prefixes is not None:
            self.prefixes.make_room(min(self.prefixes.room, self.room - pool.nbytes))
        return True

    def ensure(self, needed: Callable[[], int]) -> None:
        """Free blocks for a step that needs ``needed()`` more: the pool grown, else the most recently admitted
        job of any paged group preempted, again, until they are free (``needed`` is asked again after each,
        a preempted row of the asking group needing none). :class:`PoolFull` when no job is left to preempt."""
        while not self.grant(needed()):
            running = [(job.admitted, group, job) for group in self.groups for job in group.jobs if job is not None]
            if not running:
                raise PoolFull(f"{needed()} KV blocks needed with no job left to preempt")
            _, group, job = max(running, key=lambda entry: entry[0])
            group.preempt(job)
            self.preempted.append(job)
            self.count += 1
