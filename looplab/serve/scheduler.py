"""The engine's scheduler: it owns the jobs' states, admission and the one KV memory ledger, and tells the
runner (:mod:`looplab.serve.runner`) what to do each step through plain messages
(:mod:`looplab.serve.messages`).

A job is ``waiting`` (queued, or put back when the KV memory cannot hold it now: ``deferred``), ``running``
(placed in a group: :attr:`Scheduler.placed`), ``preempted`` (sent back by the runner when the paged pool
ran out: back at the front of the queue, recomputed when admitted again: :mod:`looplab.serve.pager`) or
``finished`` (its end delivered). ``admitted`` counts a job when it is first placed (not again when it is
placed after a preemption, or after the runner sent it back for want of blocks); one whose group or prefill
then fails is counted ``failed`` too. Each step :meth:`Scheduler.schedule` admits waiting jobs, oldest first,
while fewer than ``max_running`` run:

- under ``continuous`` (and ``depth``) batching a job joins a running group of its kind and cohort that has
  room (:meth:`~looplab.serve.messages.GroupState.can_take`), or starts one with the jobs of its cohort
  admitted with it;
- under ``depth`` batching a job that depth batching can run
  (:func:`~looplab.serve.depth_group.depth_batchable`) goes to a depth group, any other to a continuous one;
- under ``exact`` every job gets a solo group of its own, under ``cohort`` the jobs admitted together that
  share a cohort do;
- the ``speculative`` decoder's jobs admitted together at one depth K share a speculative group (under
  ``exact`` each has its own); another decoder than ``step`` runs whole, alone, at its place in the queue.

A new group is sized here (rows, prompt width, new-token columns, loop cap: :meth:`Scheduler._joinable`). A
continuous or depth group's keys and values are paged (they cost nothing until written), so such a job is
admitted while its prompt's blocks (and a preempted job's replayed tokens') fit what the pool has free or may
grow into, priced as the group takes them (:meth:`KVCache.reserve
<looplab.generation.cache.KVCache.reserve>`); any other new group is reserved in the ledger before the runner
makes it; when the free memory cannot hold it, a leaner one is tried, then the kept prefixes' room is given
back, and otherwise the job, and every one after it, goes back to the front of the queue in order.
:meth:`Scheduler.update` reads the runner's answer: it delivers each job's events to its sink (counting
tokens, loops and ends), releases the bytes of groups that ended or were never made, and keeps the running
groups' states for the next admissions.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace

from looplab.errors import LooplabError
from looplab.serve.batch import End, Failed, Job, Token, joinable_room, solo_bytes
from looplab.serve.continuous_group import ContinuousGroup, pooled_cohort
from looplab.serve.depth_group import DepthGroup, depth_batchable
from looplab.serve.ledger import DoesNotFit, KVLedger, job_blocks_bytes, job_bytes, paged_job_bytes
from looplab.serve.messages import GroupPlan, GroupState, Join, PoolState, RunnerOutput, SchedulerOutput
from looplab.serve.speculative_group import SPECULATIVE, speculative_bytes
from looplab.serve.whole_group import STEPPED

__all__ = ["Scheduler", "NeverFits", "BATCHING"]

BATCHING = ("continuous", "exact", "cohort", "depth")
#: the batchings whose jobs join running groups
JOINING = ("continuous", "depth")
#: a joinable group's sizes (Scheduler._joinable): a lone job's rows, and how many admitted jobs a busy
#: engine's new group is sized for
MIN_ROWS, RECENT = 8, 64
#: the group class of each joinable kind (its new-token slots per budget, cache and cohorts)
JOINABLE = {cls.KIND: cls for cls in (ContinuousGroup, DepthGroup)}
#: the kinds whose keys and values the runner pages
PAGED = tuple(JOINABLE)


class NeverFits(LooplabError):
    """A job that could never be admitted (more than the queue or the KV memory ever holds): HTTP 400."""


class Scheduler:
    """Admission, job states and the KV ledger of one engine (see the module docstring).

    Args:
        model: the model as the decoders read it (its shape sizes the groups).
        max_running: jobs decoded at once; ``batching``: BATCHING.
        kv_memory: the bytes the groups' caches and kept prefixes may take together.
        prefix_memory: the most of it kept prefixes may hold.
        paged: whether the runner pages continuous and depth groups' keys and values (else they are reserved
            whole).
    """

    def __init__(self, model, max_running: int, batching: str, kv_memory: int, prefix_memory: int, paged: bool = True):
        self.model, self.max_running, self.batching = model, max_running, batching
        self.ledger = KVLedger(kv_memory)
        self.prefix_memory = prefix_memory
        self.waiting: deque[Job] = deque()
        #: the running groups as the runner last reported them
        self.groups: dict[int, GroupState] = {}
        #: counts of jobs (submitted, admitted, joined, deferred, finished, cancelled, failed), steps and tokens
        #: (generated, scored, prompt), read by /health and /metrics; the generated tokens by their loops
        self.stats: Counter[str] = Counter()
        self.loops: Counter[int] = Counter()
        #: bytes the running groups' caches hold, after the latest step
        self.cache_bytes = 0
        #: (prompt length, budget, loop cap) of the latest admitted jobs, to size new groups
        self._recent: deque[tuple[int, int, int]] = deque(maxlen=RECENT)
        #: (cohort, exit) → whether a depth group can run such jobs (worked out once per pair)
        self._depth_ok: dict[tuple, bool] = {}
        #: (cohort, exit) → a job's cohort in a paged continuous group
        self._pooled: dict[tuple, tuple] = {}
        self._next_id = 0
        #: the jobs placed in groups and not yet ended, by id (what :meth:`Engine.cancel_all` reaches)
        self.placed: dict[int, Job] = {}
        #: whether this step's plans take the kept prefixes' room
        self.evicting = False
        #: the paged pool as the runner last reported it, and the kind of group whose caches it holds
        self.pool = PoolState()
        self.paged = PAGED if paged else ()
        self._admissions = 0

    @property
    def running(self) -> int:
        return sum(group.holds for group in self.groups.values())

    def check_fits(self, job: Job) -> None:
        """:class:`NeverFits` for a job whose leanest group (the last of :meth:`_sizes`: the job alone, in the
        group its kind gives it) exceeds the KV memory: it would wait for ever."""
        if self._kind(job) in self.paged:
            needed = paged_job_bytes(self.model, job)
        else:  # sized with no bound, then held to the limit
            needed = self._sizes([job], {})[-1](math.inf).nbytes
        if needed > self.ledger.limit:
            rule = job.options.exit_rule
            raise NeverFits(
                f"a completion of {len(job.prompt)} prompt tokens and {job.max_new} new ones at {rule.loops} loops "
                f"({job.options.cache} cache) needs {needed / 2**20:,.1f} MiB of KV memory, more than the server "
                f"holds (--kv-memory {self.ledger.describe()}): ask for fewer tokens or loops"
            )

    def add(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (checked by the engine)."""
        self.waiting.extend(jobs)
        self.stats["submitted"] += len(jobs)
        self.stats["prompt_tokens"] += sum(len(job.prompt) for job in jobs if job.forced is None)

    def schedule(self) -> SchedulerOutput:
        """This step's orders: the waiting jobs admitted while fewer than ``max_running`` run, each joining a
        running group or in a new one; those that do not fit now go back to the front of the queue."""
        admitted = [self.waiting.popleft() for _ in range(min(self.max_running - self.running, len(self.waiting)))]
        groups = dict(self.groups)  # their free rows taken as jobs join
        self.evicting = False
        plans: list[GroupPlan] = []
        joins: list[Join] = []
        cohorts: dict[tuple, list[Job]] = {}
        deferred: list[Job] = []
        paged = self._paged_room()
        for index, job in enumerate(admitted):
            kind = self._kind(job)
            need = self._prompt_bytes(job) if kind in self.paged else 0
            if job.cancelled.is_set():
                self.deliver(job, End("cancelled"))
                continue
            if deferred or need > paged:  # a paged job waits while its prompt's blocks cannot be had
                deferred.append(job)
                continue
            paged -= need
            if kind in JOINABLE and self._join(job, kind, groups, joins):
                continue
            if kind == "whole":  # alone, at its place in the queue
                plan = self._plan([job], groups)
                if plan is None:
                    deferred.append(job)
                else:
                    plans.append(plan)
            else:
                key = (index,) if self.batching == "exact" else (kind, self._cohort(kind, job))
                cohorts.setdefault(key, []).append(job)
        blocked = False  # a cohort's group did not fit: the later ones wait behind it
        for members in cohorts.values():
            plan = None if blocked else self._plan(members, groups)
            blocked = plan is None
            if plan is not None:
                plans.append(plan)
            deferred.extend(members[0 if plan is None else len(plan.jobs) :])
        if deferred:
            place = {id(job): index for index, job in enumerate(admitted)}
            deferred.sort(key=lambda job: place[id(job)])  # back in the queue in their order
            self.stats["deferred"] += len(deferred)
            self.waiting.extendleft(reversed(deferred))
        for job in [*(job for plan in plans for job in plan.jobs), *(join.job for join in joins)]:
            self.placed[id(job)] = job
            self.stats["admitted"] += job.admitted == 0
            self._admissions += 1
            job.admitted = self._admissions
        unpaged = self.ledger.limit - self.ledger.held_by_groups
        room = 0 if self.evicting else min(self.prefix_memory, unpaged - self.ledger.pool)
        return SchedulerOutput(tuple(plans), tuple(joins), room, unpaged)

    def update(self, result: RunnerOutput) -> None:
        """Deliver the runner's events, put the jobs it sent back at the front of the queue (the earliest
        admitted first), release what ended, and keep the running groups' and the pool's states."""
        for job, event in result.events:
            self.deliver(job, event)
        back = sorted(result.requeued, key=lambda job: job.admitted)
        self.waiting.extendleft(reversed(back))
        self.stats["preempted"] += result.preempted
        self.stats["deferred"] += len(back) - result.preempted
        sent_back = {id(job) for job in back}
        self.placed = {key: job for key, job in self.placed.items() if not job.closed and key not in sent_back}
        self.groups = {group.id: group for group in result.groups}
        for key in [key for key in self.ledger.groups if key not in self.groups]:
            self.ledger.release(key)
        self.ledger.prefixes, self.ledger.pool, self.pool = result.prefix_bytes, result.pool.nbytes, result.pool
        self.cache_bytes = result.cache_bytes
        self.stats["steps"] += 1

    def deliver(self, job: Job, event: Token | End | Failed) -> None:
        """Count ``event`` and hand it to ``job``'s sink."""
        if isinstance(event, Token):
            if job.forced is None:
                self.stats["tokens"] += 1
                self.loops[event.depth] += 1
            else:
                self.stats["scored_tokens"] += 1
        elif isinstance(event, End):
            job.closed = True
            self.stats["cancelled" if event.reason == "cancelled" else "finished"] += 1
        else:
            job.closed = True
            self.stats["failed"] += 1
        job.sink(event)

    def _paged_room(self) -> int:
        """Bytes of blocks the pool can give now: its free blocks, and what it may grow into."""
        grows = self.ledger.limit - self.ledger.held_by_groups - self.ledger.pool  # kept prefixes give way
        return self.pool.free * self.pool.block_bytes + max(0, grows)

    def _prompt_bytes(self, job: Job) -> int:
        """Bytes of the pool blocks ``job``'s prompt takes when it is admitted, and, for a preempted job, those of
        the tokens it replays after it (from any slot of a block on): admitted when the pool cannot give them
        too, it would be preempted again before it got back to where it was."""
        return job_blocks_bytes(self.model, job, len(job.replay))

    def _kind(self, job: Job) -> str:
        """The kind of group ``job`` goes to (a key of :data:`looplab.serve.runner.GROUPS`)."""
        decoder = job.options.decoder
        if decoder == SPECULATIVE:
            return "speculative"
        if decoder != STEPPED:
            return "whole"
        if self.batching not in JOINING:
            return "solo"
        if self.batching == "depth":
            key = (job.cohort, job.options.exit_rule)
            if key not in self._depth_ok:
                self._depth_ok[key] = depth_batchable(self.model, job)
            if self._depth_ok[key]:
                return "depth"
        return "continuous"

    def _cohort(self, kind: str, job: Job) -> tuple:
        """What the jobs of one group of ``kind`` share: a paged continuous group's say
        (:func:`~looplab.serve.continuous_group.pooled_cohort`: worked out once per cohort and exit), another
        joinable kind's class says; a speculative group's rows share the exit's loops K too (they verify at one
        depth); the job's cohort else."""
        if kind == ContinuousGroup.KIND and kind in self.paged:
            key = (job.cohort, job.options.exit_rule)
            if key not in self._pooled:
                self._pooled[key] = pooled_cohort(self.model, job)
            return self._pooled[key]
        if kind in JOINABLE:
            return JOINABLE[kind].cohort_of(job)
        return (*job.cohort, job.options.exit_rule.loops) if kind == "speculative" else job.cohort

    def _join(self, job: Job, kind: str, groups: dict[int, GroupState], joins: list[Join]) -> bool:
        """Order ``job`` into a running group of its ``kind`` that can take it; whether one could."""
        cohort = self._cohort(kind, job)
        group = next((g for g in groups.values() if g.kind == kind and g.can_take(job, cohort)), None)
        if group is None:
            return False
        groups[group.id] = replace(group, free_rows=group.free_rows - 1, holds=group.holds + 1)
        joins.append(Join(group.id, job))
        self.stats["joined"] += 1
        return True

    def _plan(self, members: list[Job], groups) -> GroupPlan | None:
        """A new group for (the first of) ``members`` that fits the free KV memory, reserved; the kept prefixes
        give their room back for it when nothing fits beside them (``self.evicting``: the runner trims them to
        nothing this step, and the ledger counts them gone at once)."""
        free = self.ledger.free
        for room, evicting in ((free, False), (free + self.ledger.prefixes, True))[: 2 if self.ledger.prefixes else 1]:
            for size in self._sizes(members, groups):
                try:
                    plan = size(room)
                except DoesNotFit:
                    continue
                if evicting:
                    self.evicting, self.ledger.prefixes = True, 0
                self._next_id = plan.id
                self.ledger.reserve(plan.id, plan.nbytes)
                self._recent.extend(_size(job) for job in plan.jobs)
                return plan
        return None

    def _sizes(self, members: list[Job], groups) -> list[Callable[[int], GroupPlan]]:
        """How a new group for ``members`` may be sized within a free byte count, the roomiest first; each raises
        :class:`DoesNotFit` when it does not fit. The last takes the first member alone, as lean as it can be:
        that fits whenever nothing else runs (the engine refuses a job that could not)."""
        kind = self._kind(members[0])
        if kind in ("continuous", "depth"):
            return [
                lambda free: self._joinable(kind, members, groups, free),
                lambda free: self._lean(kind, members, free),
                lambda free: self._lean(kind, members[:1], free),
            ]
        bytes_of = {"solo": solo_bytes, "speculative": speculative_bytes}.get(kind)

        def fixed(jobs: list[Job]) -> Callable[[int], GroupPlan]:
            def size(free: int) -> GroupPlan:
                nbytes = job_bytes(self.model, jobs[0]) if bytes_of is None else bytes_of(self.model, jobs)
                if nbytes > free:
                    raise DoesNotFit(f"{len(jobs)} jobs need {nbytes:,} bytes of KV memory, {free:,} are free")
                return self._new(kind, jobs, nbytes=nbytes)

            return size

        return [fixed(members[:1])] if kind == "whole" else [fixed(members), fixed(members[:1])]

    def _joinable(self, kind: str, members: list[Job], groups, free: int) -> GroupPlan:
        """A new joinable group for ``members`` within ``free`` bytes. On a busy engine (several jobs arriving
        together, or a group of their kind and cohort running) it gets ``max_running`` rows, and room for the
        longest prompt, the kind's COLUMNS_PER_BUDGET times the largest budget and the deepest loop cap (but
        for the read-only exit, whose rows all run to the cap) of the last RECENT jobs too, so that later jobs
        join it instead of starting groups of their own (each a forward pass of its own every step; measured:
        bench/serve.py); a lone job on an idle engine gets MIN_ROWS rows and its own room (its caches are
        zeroed and read every step). Rows that do not fit ``free`` are left out."""
        cohort = self._cohort(kind, members[0])
        busy = len(members) > 1 or any(g.kind == kind and g.cohort == cohort for g in groups.values())
        rows = self.max_running if busy else min(self.max_running, MIN_ROWS)
        sizes = [*(_size(job) for job in members), *(self._recent if busy else ())]
        width = max(size[0] for size in sizes)
        columns = JOINABLE[kind].COLUMNS_PER_BUDGET * max(size[1] for size in sizes)
        cap = cohort[-1] or max(size[2] for size in sizes)  # a read-only cohort's one cap
        return self._room(kind, members, rows, columns, width, cap, free)

    def _lean(self, kind: str, jobs: list[Job], free: int) -> GroupPlan:
        """A joinable group with just the room ``jobs`` need."""
        width, budget = max(len(job.prompt) for job in jobs), max(job.max_new for job in jobs)
        return self._room(kind, jobs, len(jobs), budget, width, 0, free)

    def _room(self, kind: str, jobs: list[Job], rows: int, columns: int, width: int, cap: int, free: int) -> GroupPlan:
        """A joinable group's plan: its rows within ``free`` bytes, a paged one's unbounded and reserving none
        (the pool pays for what its rows write)."""
        paged = kind in self.paged
        room = joinable_room(self.model, jobs, rows, columns, width, cap, None if paged else free, JOINABLE[kind].CACHE)
        return self._new(kind, jobs, room.rows, room.width, room.columns, room.cap, 0 if paged else room.nbytes)

    def _new(self, kind: str, jobs: list[Job], rows=0, width=0, columns=0, cap=0, nbytes=0) -> GroupPlan:
        """A plan with the next id (taken only when the plan is kept)."""
        return GroupPlan(self._next_id + 1, kind, tuple(jobs), rows, width, columns, cap, nbytes)


def _size(job: Job) -> tuple[int, int, int]:
    """What a group needs room for to take ``job``: (prompt length, budget, loop cap)."""
    return len(job.prompt), job.max_new, job.options.exit_rule.loops
