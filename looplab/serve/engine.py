"""The continuous-batching engine: one thread that owns the model and steps every running job.

Each iteration of its loop

1. admits waiting jobs while fewer than ``max_running`` run: under ``batching="continuous"`` (the
   default) a job joins a running :class:`~looplab.serve.continuous.ContinuousGroup` of its cohort
   (the same cache policy and decoder; greedy, sampled and scoring jobs alike, at any exit and loop cap,
   each row stopped and picked by its own job) between two steps, or starts one. Under ``exact`` every job gets its
   own group; under ``cohort`` jobs admitted together that share a cohort are prefilled into one; under
   ``depth`` a job that depth batching can run joins a :class:`~looplab.serve.depth_group.DepthGroup` (its
   rows each at their own loop; :func:`~looplab.serve.depth_group.depth_batchable`), any other a continuous
   group. The ``speculative`` decoder's jobs admitted together share a
   :class:`~looplab.serve.speculative_group.SpeculativeGroup` (a draft-and-verify round a step); a job naming
   another decoder than these runs whole, alone (:class:`~looplab.serve.whole.WholeGroup`);
2. runs one decode step of every group: each live job gets one token, at its own exit's depth (a depth
   group's step runs loops of every row's token, each at its own loop, until one of them exits);
3. drops the groups whose jobs all ended (their budget, end-of-text, a stop string, or a client that
   left: :meth:`Job.cancelled` is read before every step).

So requests join the running decode between steps and leave it when they finish, each with its own
loop budget, exit and cache. What is shared is the step loop, the model's weights and the thread;
``continuous`` also shares every matmul of a step between the jobs of a cohort. What
``exact`` keeps apart is every tensor a job's logits depend on: a job's rows are never padded or
batched with another job's, because a matmul over more rows, or a softmax over more (masked) keys,
changes the last bits of a row's result (measured on this CPU: 3e-8 in a log-probability). A greedy
job's tokens and log-probabilities are therefore those of :func:`looplab.generation.generate` on its
prompt alone, however many jobs run beside it. ``continuous`` and ``cohort`` trade that for batched
matmuls (tokens agree; log-probabilities within ~1e-6; a seeded sampled job draws its tokens alone
with its own generator, from its own row).

A bounded queue: :meth:`Engine.submit` refuses (:class:`Busy`) when ``max_queue`` jobs already wait,
and (:class:`Closed`) once :meth:`Engine.stop_intake` was called; :meth:`Engine.close` drains.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from functools import partial

import torch

from looplab.errors import LooplabError
from looplab.generation.views import decodable
from looplab.serve.batch import End, Failed, Group, Job, Token
from looplab.serve.continuous import ContinuousGroup
from looplab.serve.depth_group import DepthGroup, depth_batchable
from looplab.serve.ledger import DoesNotFit, KVLedger, default_kv_memory, job_bytes
from looplab.serve.prefixes import PrefixStore
from looplab.serve.speculative_group import SPECULATIVE, SpeculativeGroup
from looplab.serve.whole import STEPPED, WholeGroup

__all__ = ["Engine", "Busy", "Closed", "BATCHING"]

BATCHING = ("continuous", "exact", "cohort", "depth")
#: the batchings whose jobs join running groups
JOINING = ("continuous", "depth")
#: a continuous or depth group's sizes (Engine._continuous_group): a lone job's rows, and how many admitted
#: jobs a busy engine's new group is sized for
MIN_ROWS, RECENT = 8, 64


class Busy(LooplabError):
    """The queue is full: the server answers 503."""


class Closed(LooplabError):
    """The engine takes no new jobs (shutting down): the server answers 503."""


class NeverFits(LooplabError):
    """A request of more jobs than the queue ever holds (waiting would never end): the server answers 400."""


class Engine:
    """Steps every admitted :class:`Job` on one thread (see the module docstring).

    Args:
        model: a causal looplab model or a retrofit (as :func:`looplab.generation.generate` takes).
        max_running: jobs decoded at once; later ones wait.
        max_queue: jobs that may wait; one more is refused with :class:`Busy`.
        batching: ``continuous`` (jobs join a running batch of their cohort), ``exact`` (one decoder
            per job), ``cohort`` (jobs admitted together) or ``depth`` (continuous, rows at their own loops
            where the job allows it).
        on_step: called on the engine's thread after every iteration, with the engine (a hook for
            observing or pacing it).
        kv_memory: the bytes the running groups' KV caches may take together (:mod:`looplab.serve.ledger`;
            default: half of what the device holds beside the weights).
        prefix_memory: the most of ``kv_memory`` kept prompt blocks may hold (:mod:`looplab.serve.prefixes`;
            default a quarter of it; 0: no prefix caching).
    """

    def __init__(
        self,
        model,
        max_running: int = 32,
        max_queue: int = 64,
        batching: str = "continuous",
        on_step: Callable[[Engine], None] | None = None,
        kv_memory: int | None = None,
        prefix_memory: int | None = None,
    ):
        if batching not in BATCHING:
            raise LooplabError(f"unknown batching {batching!r}; valid choices: {', '.join(BATCHING)}")
        if max_running < 1 or max_queue < 0:
            raise LooplabError(f"max running must be ≥ 1 and max queue ≥ 0, got {max_running} and {max_queue}")
        self.model = decodable(model)
        self.model.eval()
        if kv_memory is not None and kv_memory < 1:
            raise LooplabError(f"the KV memory must be a positive number of bytes, got {kv_memory}")
        self.ledger = KVLedger(default_kv_memory(self.model) if kv_memory is None else kv_memory)
        if prefix_memory is not None and prefix_memory < 0:
            raise LooplabError(f"the prefix cache's memory must be ≥ 0 bytes, got {prefix_memory}")
        prefix_memory = self.ledger.limit // 4 if prefix_memory is None else prefix_memory
        #: kept prompt blocks (continuous groups only: ``exact`` keeps every row's own)
        self.prefixes = PrefixStore(self.ledger, prefix_memory) if batching in JOINING and prefix_memory else None
        self.max_running, self.max_queue, self.batching, self.on_step = max_running, max_queue, batching, on_step
        #: counts of jobs (submitted, admitted, joined, finished, cancelled, failed), steps and tokens (generated,
        #: scored, prompt), read by /health and /metrics
        self.stats: Counter[str] = Counter()
        #: the generated tokens by the loops each ran
        self.loops: Counter[int] = Counter()
        #: bytes the running groups' KV caches hold, after the latest iteration (worked out on the engine's
        #: thread, which grows the caches)
        self.cache_bytes = 0
        self._waiting: deque[Job] = deque()
        #: (prompt length, budget, loop cap) of the latest admitted jobs, to size new groups
        self._recent: deque[tuple[int, int, int]] = deque(maxlen=RECENT)
        self._groups: list[Group] = []
        #: (cohort, exit) → whether a depth group can run such jobs (worked out once per pair)
        self._depth_ok: dict[tuple, bool] = {}
        self._cond = threading.Condition()
        self._accepting, self._closing = True, False
        self._thread = threading.Thread(target=self._loop, name="looplab-serve-engine", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(group.held for group in self._groups)

    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (all or none)."""
        with self._cond:
            if not self._accepting:
                raise Closed("the server is shutting down and takes no new requests")
            if len(jobs) > self.max_queue:
                raise NeverFits(
                    f"the request asks for {len(jobs)} completions (prompts × n), more than the server ever queues "
                    f"(--max-queue {self.max_queue}): send at most {self.max_queue} at once"
                )
            for job in jobs:
                self._check_fits(job)
            if len(self._waiting) + len(jobs) > self.max_queue:
                raise Busy(f"the server is busy: {len(self._waiting)} requests wait (--max-queue {self.max_queue})")
            for job in jobs:
                job.sink = self._counted(job, job.sink)
            self._waiting.extend(jobs)
            self.stats["submitted"] += len(jobs)
            self.stats["prompt_tokens"] += sum(len(job.prompt) for job in jobs if job.forced is None)
            self._cond.notify()

    def _check_fits(self, job: Job) -> None:
        """:class:`NeverFits` for a job whose KV cache alone exceeds the engine's KV memory."""
        needed = job_bytes(self.model, job)
        if needed > self.ledger.limit:
            rule = job.options.exit_rule
            raise NeverFits(
                f"a completion of {len(job.prompt)} prompt tokens and {job.max_new} new ones at {rule.loops} loops "
                f"({job.options.cache} cache) needs {needed / 2**20:,.1f} MiB of KV memory, more than the server "
                f"holds (--kv-memory {self.ledger.describe()}): ask for fewer tokens or loops"
            )

    def stop_intake(self) -> None:
        """Refuse new jobs from now on; those queued and running go on."""
        with self._cond:
            self._accepting = False

    def cancel_all(self) -> None:
        """End every queued and running job at its next step, as if its client had left (``cancelled``)."""
        with self._cond:
            jobs = [*self._waiting, *(job for group in list(self._groups) for job in group.jobs if job is not None)]
            for job in jobs:
                job.cancelled.set()
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking jobs, finish every queued and running one, and end the thread."""
        with self._cond:
            self._accepting, self._closing = False, True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _counted(self, job: Job, sink):
        def counted(event) -> None:
            if isinstance(event, Token):
                if job.forced is None:
                    self.stats["tokens"] += 1
                    self.loops[event.depth] += 1
                else:
                    self.stats["scored_tokens"] += 1
            elif isinstance(event, End | Failed):
                job.closed = True
            if isinstance(event, End):
                self.stats["cancelled" if event.reason == "cancelled" else "finished"] += 1
            elif isinstance(event, Failed):
                self.stats["failed"] += 1
            sink(event)

        return counted

    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # per thread: this one only decodes
        while True:
            with self._cond:
                while not self._waiting and not self._groups and not self._closing:
                    self._cond.wait()
                if self._closing and not self._waiting and not self._groups:
                    return
                free = self.max_running - self.running
                admitted = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
            self._admit(admitted)
            for group in self._groups:
                try:
                    group.step()
                except Exception as err:  # a job the decoder fails on (out of memory) fails alone
                    self._fail([job for job in group.jobs if job is not None], err)
                    group.abandon()
            for group in self._groups:
                if group.done:
                    self.ledger.release(group)
            self._groups = [group for group in self._groups if not group.done]
            self.cache_bytes = sum(group.cache_bytes() for group in self._groups)
            self.stats["steps"] += 1
            if self.on_step is not None:
                self.on_step(self)

    def _admit(self, jobs: list[Job]) -> None:
        """Put each of ``jobs`` into a group, in order: a running one it joins, or a new one where the free KV
        memory holds it. The first job that does not fit now, and every job after it, go back to the front of the
        queue (their order kept: no later job overtakes them)."""
        cohorts: dict[tuple, list[Job]] = {}
        deferred: list[Job] = []
        for index, job in enumerate(jobs):
            if job.cancelled.is_set():
                job.sink(End("cancelled"))
                continue
            if deferred:
                deferred.append(job)
            elif job.options.decoder not in (STEPPED, SPECULATIVE):
                if not self._start([job], [(1, lambda free, job=job: WholeGroup(self.model, job, free))]):
                    deferred.append(job)
            elif job.options.decoder == STEPPED and self.batching in JOINING and self._join(job):
                continue
            else:
                key = (self._kind(job), job.cohort) if self.batching != "exact" else (index,)
                cohorts.setdefault(key, []).append(job)
        for members in cohorts.values():
            if deferred:
                deferred.extend(members)
                continue
            deferred.extend(members[self._start(members, self._makers(members)) :])
        if deferred:
            self.stats["deferred"] += len(deferred)
            with self._cond:
                self._waiting.extendleft(reversed(deferred))

    def _makers(self, members: list[Job]) -> list[tuple[int, Callable]]:
        """How a new group for ``members`` may be made, the roomiest first: (how many of the members it takes, a
        maker of it given the free KV memory). The last takes the first member alone, as lean as it can be:
        that fits whenever nothing else runs (:meth:`submit` refuses a job that could not)."""
        model = self.model
        if members[0].options.decoder == SPECULATIVE:  # rows whose slots advance together: no later joins
            return [
                (len(members), lambda free: SpeculativeGroup(model, members, free)),
                (1, lambda free: SpeculativeGroup(model, members[:1], free)),
            ]
        if self.batching not in JOINING:
            return [
                (len(members), lambda free: Group(model, members, free)),
                (1, lambda free: Group(model, members[:1], free)),
            ]
        make = self._maker(members[0])

        def lean(jobs: list[Job], free: int) -> ContinuousGroup | DepthGroup:
            width, budget = max(len(job.prompt) for job in jobs), max(job.max_new for job in jobs)
            return make(model, jobs, len(jobs), budget, width, memory=free)

        return [
            (len(members), lambda free: self._continuous_group(members, free)),
            (len(members), lambda free: lean(members, free)),
            (1, lambda free: lean(members[:1], free)),
        ]

    def _start(self, members: list[Job], makers: list[tuple[int, Callable]]) -> int:
        """Make the first group of ``makers`` that fits the free KV memory, reserve its bytes and run it; how many
        of ``members`` it took (0: none fits now). Kept prefixes give their room back first where nothing fits
        beside them. A group whose prefill fails (out of memory) fails its jobs."""
        while True:
            for count, make in makers:
                group = None
                try:
                    group = make(self.ledger.free)
                    self.ledger.reserve(group, group.nbytes)
                    group.begin()
                except DoesNotFit:
                    continue
                except Exception as err:  # out of memory, or the prefill failed: these jobs fail, the rest go on
                    if group is not None:
                        self.ledger.release(group)
                    self._fail(members[:count], err)
                    return count
                self._groups.append(group)
                self.stats["admitted"] += count
                self._recent.extend(_size(job) for job in members[:count])
                return count
            if self.prefixes is None or not self.prefixes.nbytes:
                return 0
            self.prefixes.clear()

    def _kind(self, job: Job) -> type:
        """The group ``job`` joins: a speculative one for the speculative decoder, a depth group under ``depth``
        batching where one can run it, else continuous."""
        if job.options.decoder == SPECULATIVE:
            return SpeculativeGroup
        if self.batching != "depth":
            return ContinuousGroup
        key = (job.cohort, job.options.exit_rule)
        if key not in self._depth_ok:
            self._depth_ok[key] = depth_batchable(self.model, job)
        return DepthGroup if self._depth_ok[key] else ContinuousGroup

    def _maker(self, job: Job) -> Callable:
        """The class of the group ``job`` joins, with the engine's prefix store where it keeps prefixes."""
        if self._kind(job) is DepthGroup:
            return DepthGroup
        return partial(ContinuousGroup, prefixes=self.prefixes)

    def _continuous_group(self, members: list[Job], free: int) -> ContinuousGroup | DepthGroup:
        """A new continuous or depth group for ``members`` within ``free`` bytes of KV memory. A lone job on an
        idle engine gets a lean one (MIN_ROWS rows, its own prompt width and the group kind's
        COLUMNS_PER_BUDGET times its budget: its caches are zeroed and read every step). On a busy engine
        (several jobs arriving together, or a group of their kind and cohort running) the group gets
        ``max_running`` rows, and room for the longest prompt, COLUMNS_PER_BUDGET times the largest budget and
        the deepest loop cap (but for the read-only exit, whose rows all run to the cap) of the last RECENT
        jobs too, so that later jobs join it instead of starting groups of their own (each a forward pass of
        its own every step; measured: bench/serve.py). Rows that do not fit ``free`` are left out."""
        cohort, kind = members[0].cohort, self._kind(members[0])
        busy = len(members) > 1 or any(type(g) is kind and g.cohort == cohort for g in self._groups)
        rows = self.max_running if busy else min(self.max_running, MIN_ROWS)
        sizes = [
            *(_size(job) for job in members),
            *(self._recent if busy else ()),
        ]
        width, columns = max(size[0] for size in sizes), kind.COLUMNS_PER_BUDGET * max(size[1] for size in sizes)
        cap = cohort[-1] or max(size[2] for size in sizes)  # a read-only cohort's one cap
        return self._maker(members[0])(self.model, members, rows, columns, width, cap, memory=free)

    def _join(self, job: Job) -> bool:
        """Put ``job`` into a running group of its kind that can take it; whether one could."""
        kind = self._kind(job)
        group = next((g for g in self._groups if type(g) is kind and g.can_take(job)), None)
        if group is None:
            return False
        try:
            group.join([job])
            self.stats["admitted"] += 1
            self.stats["joined"] += 1
        except Exception as err:  # its prefill failed (out of memory): this job fails, the group goes on
            self._fail([job], err)
        return True

    def _fail(self, jobs: list[Job], err: Exception) -> None:
        """End the jobs still open with one line naming ``err``."""
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        for job in jobs:
            if not job.closed:
                job.sink(Failed(first or type(err).__name__))


def _size(job: Job) -> tuple[int, int, int]:
    """What a group needs room for to take ``job``: (prompt length, budget, loop cap), as ``Engine._recent`` holds."""
    return len(job.prompt), job.max_new, job.options.exit_rule.loops
