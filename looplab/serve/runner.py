"""The engine's runner: it owns the model, every group's decoder and KV caches, and the kept prefixes, and does
what the scheduler's :class:`~looplab.serve.messages.SchedulerOutput` orders — make groups, place joining
jobs, step every group — answering with a :class:`~looplab.serve.messages.RunnerOutput`.

The jobs joining one group in a step are prefilled together (a prefill of each alone would read every weight
once a job: at the Ouro-1.4B shape in float32, about a quarter second a loop). It owns the paged KV pool that
continuous and depth groups keep their keys and values in (:mod:`looplab.serve.pager`), grown within the bytes the
scheduler gives it; a job whose prompt's blocks cannot be had goes back, and a step that needs blocks the pool
cannot give preempts the latest admitted jobs, which go back too (``RunnerOutput.requeued``). Otherwise it
decides nothing about admission or memory: the scheduler sized every other group it asks for. A group whose
making or prefill fails (out of memory), a join whose prefill fails, or a step that raises fails the jobs
concerned with one line (:class:`~looplab.serve.batch.Failed`); the others go on.
"""

from __future__ import annotations

import torch

from looplab.serve.batch import Failed, Group, Job, JoinableRows
from looplab.serve.continuous_group import ContinuousGroup
from looplab.serve.depth_group import DepthGroup
from looplab.serve.messages import GroupPlan, GroupState, PoolState, RunnerOutput, SchedulerOutput
from looplab.serve.pager import Pager
from looplab.serve.prefixes import PrefixStore
from looplab.serve.speculative_group import SpeculativeGroup
from looplab.serve.whole_group import WholeGroup

__all__ = ["Runner", "GROUPS", "group_state"]

#: every group the runner makes, by its kind (a plan's ``kind``): a continuous group (jobs join it), a depth
#: group (rows at their own loops; jobs join it), a solo group (``exact`` and ``cohort`` batching: no joins), a
#: speculative group (a round a step) and a whole job (a decoder the engine does not step)
GROUPS = {cls.KIND: cls for cls in (ContinuousGroup, DepthGroup, Group, SpeculativeGroup, WholeGroup)}


class Runner:
    """Makes and steps the groups the scheduler plans (see the module docstring).

    Args:
        model: the model as the decoders read it.
        prefix_memory: the most bytes kept prompt blocks may hold (0: no prefix caching).
        paged: whether continuous and depth groups keep their keys and values in the paged pool (else their own).
    """

    def __init__(self, model, prefix_memory: int = 0, paged: bool = True):
        self.model = model
        #: kept prompt blocks (continuous groups read and keep them)
        self.prefixes = PrefixStore(prefix_memory) if prefix_memory else None
        #: the running groups by the scheduler's ids
        self.groups: dict[int, object] = {}
        #: the jobs taken and not yet ended, whose outboxes each step collects
        self.held: list[Job] = []
        #: the paged KV pool of the continuous and depth groups
        self.pager = Pager(self.prefixes)
        self.paged = paged

    def execute(self, order: SchedulerOutput) -> RunnerOutput:
        """Trim the kept prefixes, make the planned groups, place the joins, step every group; what it did."""
        torch.set_grad_enabled(False)  # per thread: the engine's only decodes
        if self.prefixes is not None:
            self.prefixes.make_room(order.prefix_room)
        pager, preempted = self.pager, self.pager.count
        pager.room, pager.preempted = order.pool_room, []
        pager.fit_idle()
        for plan in order.plans:
            self.held.extend(plan.jobs)
            group = None
            try:
                group = self._make(plan)
                group.begin()
            except Exception as err:  # out of memory, or the prefill failed: these jobs fail, the rest go on
                if group is not None:
                    group.abandon()  # its rows' blocks go back to the pool
                _fail(_kept(plan.jobs, pager), err)
                continue
            self.groups[plan.id] = group
            if isinstance(group, JoinableRows) and group.pager is not None:
                pager.groups.append(group)
        joining: dict[int, list[Job]] = {}
        for join in order.joins:  # a group's newcomers of one step prefill together: one pass over the weights
            joining.setdefault(join.group, []).append(join.job)
        for key, jobs in joining.items():
            self.held.extend(jobs)
            try:
                self.groups[key].join(jobs)
            except Exception as err:  # their prefill failed (out of memory): these jobs fail, the group goes on
                _fail(_kept(jobs, pager), err)
        for group in self.groups.values():
            try:
                group.step()
            except Exception as err:  # a job the decoder fails on (out of memory) fails alone
                _fail([job for job in group.jobs if job is not None], err)
                group.abandon()
        self.groups = {key: group for key, group in self.groups.items() if not group.done}
        pager.groups = [group for group in pager.groups if not group.done]
        events = self._collect()
        requeued = [job for job in pager.preempted if not job.closed]
        self.held = [job for job in self.held if all(job is not back for back in requeued)]
        pool = None if pager.idle else pager.pool  # an idle pool's memory is the ledger's (Pager.fit_idle)
        return RunnerOutput(
            events=events,
            groups=tuple(group_state(key, group) for key, group in self.groups.items()),
            cache_bytes=sum(group.cache_bytes() for group in self.groups.values()),
            prefix_bytes=0 if self.prefixes is None else self.prefixes.nbytes,
            requeued=tuple(requeued),
            preempted=pager.count - preempted,
            pool=PoolState() if pool is None else PoolState(pool.nbytes, pool.block_bytes, pool.used, pool.free),
        )

    def _make(self, plan: GroupPlan):
        """The group ``plan`` asks for (its decoder and caches allocated)."""
        return GROUPS[plan.kind].from_plan(self.model, plan, self.prefixes, self.pager if self.paged else None)

    def _collect(self) -> tuple:
        """Every held job's sent events, in order; jobs that ended are let go."""
        events = []
        for job in self.held:
            events.extend((job, event) for event in job.outbox)
            job.outbox.clear()
        self.held = [job for job in self.held if not job.closed]
        return tuple(events)


def group_state(key: int, group) -> GroupState:
    """What the scheduler reads of a running group: a joinable one's room, any one's jobs held."""
    kind = group.KIND
    if isinstance(group, JoinableRows):
        free = sum(job is None for job in group.jobs)
        return GroupState(key, kind, group.cohort, free, group.width, group.columns_left(), group.cap, group.held)
    return GroupState(key, kind, (), 0, 0, 0, 0, group.held)


def _kept(jobs, pager: Pager) -> list[Job]:
    """Those of ``jobs`` the pager did not send back to the queue (those go back, not fail)."""
    return [job for job in jobs if all(job is not back for back in pager.preempted)]


def _fail(jobs: list[Job], err: Exception) -> None:
    """Send the jobs still open one line naming ``err``."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    for job in jobs:
        if not job.closed:
            job.send(Failed(first or type(err).__name__))
