"""The plain messages between the engine's scheduler (:mod:`looplab.serve.scheduler`) and its runner
(:mod:`looplab.serve.runner`), one exchange an engine step.

The scheduler's :class:`SchedulerOutput` says which groups the runner makes (:class:`GroupPlan`: their kind,
first jobs and size), which jobs join which running group (:class:`Join`), and how many bytes kept prefixes
may hold. The runner's :class:`RunnerOutput` says what each job's group sent it (tokens, then its end) and
what every running group looks like now (:class:`GroupState`: what the
scheduler's next admissions read), with the bytes the caches and kept prefixes hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from looplab.serve.batch import End, Failed, Job, Token

__all__ = ["GroupPlan", "GroupState", "Join", "PoolState", "RunnerOutput", "SchedulerOutput"]


@dataclass(frozen=True)
class GroupPlan:
    """A group to make: its scheduler ``id``, ``kind`` (a key of :data:`looplab.serve.runner.GROUPS`), first
    ``jobs``, and for a joinable kind its ``rows``, prompt ``width``, new-token ``columns`` and loop ``cap``;
    ``nbytes`` the KV memory it holds."""

    id: int
    kind: str
    jobs: tuple[Job, ...]
    rows: int = 0
    width: int = 0
    columns: int = 0
    cap: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Join:
    """``job`` joins running group ``group``, prefilled into a free row of it."""

    group: int
    job: Job


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's orders: ``plans`` to make and ``joins`` to place (in order), kept prefixes trimmed to
    ``prefix_room`` bytes first, then one step of every group; the paged KV pool may grow to ``pool_room``
    bytes."""

    plans: tuple[GroupPlan, ...] = ()
    joins: tuple[Join, ...] = ()
    prefix_room: int = 0
    pool_room: int = 0


@dataclass(frozen=True)
class GroupState:
    """A running group as admissions read it: its ``id`` and ``kind``, the jobs' ``cohort`` it takes, its
    ``free_rows``, prompt ``width``, new-token ``columns_left`` and loop ``cap``, and the jobs it ``holds``."""

    id: int
    kind: str
    cohort: tuple
    free_rows: int
    width: int
    columns_left: int
    cap: int
    holds: int

    def can_take(self, job: Job, cohort: tuple) -> bool:
        """Whether ``job``, of ``cohort`` (as the group's kind groups jobs), may join it now (a joinable kind
        only: its cohort, a free row, the room)."""
        return (
            self.free_rows > 0
            and cohort == self.cohort
            and job.options.exit_rule.loops <= self.cap
            and len(job.prompt) <= self.width
            and job.max_new <= self.columns_left
        )


@dataclass(frozen=True)
class PoolState:
    """The paged KV pool after a step: the bytes it holds, a block's bytes, and its blocks used and free."""

    nbytes: int = 0
    block_bytes: int = 0
    used: int = 0
    free: int = 0


@dataclass(frozen=True)
class RunnerOutput:
    """What one step did: each job's ``events`` in order (tokens, then its end; a plan that could not be made
    fails its jobs, and is not among the ``groups`` still running), the bytes their caches
    (``cache_bytes``) and kept prefixes (``prefix_bytes``) hold, the jobs sent back to the queue
    (``requeued``: preempted, or not admitted for want of blocks), the preemptions this step, and the paged
    ``pool``."""

    events: tuple[tuple[Job, Token | End | Failed], ...] = ()
    groups: tuple[GroupState, ...] = ()
    cache_bytes: int = 0
    prefix_bytes: int = 0
    requeued: tuple[Job, ...] = ()
    preempted: int = 0
    pool: PoolState = PoolState()
