"""The serving engine: one thread that runs the scheduler and the runner in turn, a step at a time.

Each step

1. the scheduler (:mod:`looplab.serve.scheduler`: job states, admission, the KV memory ledger) admits
   waiting jobs while fewer than ``max_running`` run — into a running group of their kind and cohort, or
   new groups it sizes and reserves — and says so in a :class:`~looplab.serve.messages.SchedulerOutput`;
2. the runner (:mod:`looplab.serve.runner`: the model, every group's decoder and caches, the kept
   prefixes) makes the groups, places the joining jobs and runs one decode step of every group — each live
   job gets one token at its own exit's depth (a depth group runs loops of every row's token, each at its
   own loop, until one of them exits; a speculative group one draft-and-verify round) — and answers with a
   :class:`~looplab.serve.messages.RunnerOutput`;
3. the scheduler delivers each job's tokens and end to its sink and frees what the groups that ended held
   (a job ends at its budget, end-of-text, a stop string, or when its client left: :attr:`Job.cancelled`
   is read before every step).

So requests join the running decode between steps and leave it when they finish, each with its own
loop budget, exit and cache. Under ``batching="continuous"`` (the default) the jobs of a cohort (the same
cache policy and decoder; greedy, sampled and scoring jobs alike, at any exit and loop cap, each row stopped
and picked by its own job) share every matmul of a step; ``depth`` runs the jobs depth batching can run with
their rows at their own loops (:mod:`looplab.serve.depth_group`). What ``exact`` keeps apart is every
tensor a job's logits depend on: a job's rows are never padded or batched with another job's, because a
matmul over more rows, or a softmax over more (masked) keys, changes the last bits of a row's result
(measured on this CPU: 3e-8 in a log-probability). A greedy job's tokens and log-probabilities are therefore
those of :func:`looplab.generation.generate` on its prompt alone, however many jobs run beside it.
``continuous``, ``depth`` and ``cohort`` trade that for batched matmuls (tokens agree; log-probabilities
within ~1e-6; a seeded sampled job draws its tokens alone with its own generator, from its own row).

An idle engine (no group running) that is woken by a job waits for the rest of a burst before its first
step: while more jobs keep arriving, each within ``GATHER_SHARE`` of the longest of the latest
``GATHER_STEPS`` steps' times (at most ``GATHER_MAX`` seconds) of the one before, up to ``max_running`` of
them. They are then prefilled in one forward pass, where otherwise the first few would be prefilled alone and
the rest join them a step later, in a prefill of their own (at the Ouro-1.4B shape a prefill of 16-token
prompts takes seconds; a lone request waits at most that gap once).

A bounded queue: :meth:`Engine.submit` refuses (:class:`Busy`) when ``max_queue`` jobs already wait,
and (:class:`Closed`) once :meth:`Engine.stop_intake` was called; :meth:`Engine.close` drains.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from looplab.errors import LooplabError
from looplab.generation.views import decodable
from looplab.serve.batch import Job
from looplab.serve.ledger import default_kv_memory
from looplab.serve.runner import Runner
from looplab.serve.scheduler import BATCHING, JOINING, NeverFits, Scheduler

__all__ = ["Engine", "Busy", "Closed", "NeverFits", "BATCHING"]

#: how long an idle engine waits for the next job of a burst: this share of the longest of the latest
#: GATHER_STEPS steps' seconds (the last step of a request is nearly free: not a measure of a prefill), at most
#: GATHER_MAX (measured at the Ouro-1.4B shape, bench/serve_published.py: 8 requests sent at once got 3.00-3.05
#: tokens/s when all 8 were prefilled in the first step, 2.72 when 5 were and 3 joined a step later)
GATHER_SHARE, GATHER_STEPS, GATHER_MAX = 0.01, 16, 0.005


class Busy(LooplabError):
    """The queue is full: the server answers 503."""


class Closed(LooplabError):
    """The engine takes no new jobs (shutting down): the server answers 503."""


class Engine:
    """Runs the scheduler and the runner on one thread (see the module docstring).

    Args:
        model: a causal looplab model or a retrofit (as :func:`looplab.generation.generate` takes).
        max_running: jobs decoded at once; later ones wait.
        max_queue: jobs that may wait; one more is refused with :class:`Busy`.
        batching: ``continuous`` (jobs join a running batch of their cohort), ``exact`` (one decoder
            per job), ``cohort`` (jobs admitted together) or ``depth`` (continuous, rows at their own loops
            where the job allows it).
        on_step: called on the engine's thread after every step, with the engine (a hook for observing or
            pacing it).
        kv_memory: the bytes the running groups' KV caches may take together (:mod:`looplab.serve.ledger`;
            default: half of what the device holds beside the weights).
        prefix_memory: the most of ``kv_memory`` kept prompt blocks may hold (:mod:`looplab.serve.prefixes`;
            default a quarter of it; 0: no prefix caching).
        paged: whether continuous and depth groups keep their keys and values in the runner's paged pool (preempting
            the latest job when it runs out: :mod:`looplab.serve.pager`), or in dense caches of their own,
            reserved whole when they are made (a step reads every row of a full group as a view: faster at
            long contexts, bench/paged_kv.py; nothing is preempted).
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
        paged: bool = True,
    ):
        if batching not in BATCHING:
            raise LooplabError(f"unknown batching {batching!r}; valid choices: {', '.join(BATCHING)}")
        if max_running < 1 or max_queue < 0:
            raise LooplabError(f"max running must be ≥ 1 and max queue ≥ 0, got {max_running} and {max_queue}")
        self.model = decodable(model)
        self.model.eval()
        if kv_memory is not None and kv_memory < 1:
            raise LooplabError(f"the KV memory must be a positive number of bytes, got {kv_memory}")
        kv_memory = default_kv_memory(self.model) if kv_memory is None else kv_memory
        if prefix_memory is not None and prefix_memory < 0:
            raise LooplabError(f"the prefix cache's memory must be ≥ 0 bytes, got {prefix_memory}")
        prefix_memory = kv_memory // 4 if prefix_memory is None else prefix_memory
        prefix_memory = prefix_memory if batching in JOINING else 0  # ``exact`` keeps every row's own
        self.scheduler = Scheduler(self.model, max_running, batching, kv_memory, prefix_memory, paged)
        self.runner = Runner(self.model, prefix_memory, paged)
        self.max_running, self.max_queue, self.batching, self.on_step = max_running, max_queue, batching, on_step
        #: the latest steps' seconds, and the most an idle engine waits for the next job of a burst (:meth:`_gather`)
        self.step_seconds: deque[float] = deque(maxlen=GATHER_STEPS)
        self.gather_max = GATHER_MAX
        self._cond = threading.Condition()
        self._accepting, self._closing = True, False
        self._thread = threading.Thread(target=self._loop, name="looplab-serve-engine", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    @property
    def stats(self):
        """Counts of jobs by event, steps and tokens (:class:`~looplab.serve.scheduler.Scheduler`)."""
        return self.scheduler.stats

    @property
    def loops(self):
        """The generated tokens by the loops each ran."""
        return self.scheduler.loops

    @property
    def ledger(self):
        return self.scheduler.ledger

    @property
    def pool(self):
        """The paged KV pool as the latest step left it (:class:`~looplab.serve.messages.PoolState`)."""
        return self.scheduler.pool

    @property
    def prefixes(self):
        """The kept prompt blocks (None without prefix caching)."""
        return self.runner.prefixes

    @property
    def cache_bytes(self) -> int:
        """Bytes the running groups' KV caches hold, after the latest step."""
        return self.scheduler.cache_bytes

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return self.scheduler.running

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
                self.scheduler.check_fits(job)
            if self.waiting + len(jobs) > self.max_queue:
                raise Busy(f"the server is busy: {self.waiting} requests wait (--max-queue {self.max_queue})")
            self.scheduler.add(jobs)
            self._cond.notify()

    def _gather(self) -> None:
        """Wait (holding the queue's condition) while more jobs of a burst arrive, each within the gap of the
        one before (module docstring), up to ``max_running`` waiting."""
        gap = min(self.gather_max, GATHER_SHARE * max(self.step_seconds, default=0.0))
        while gap > 0 and not self._closing and self.waiting < self.max_running:
            count = self.waiting
            self._cond.wait(gap)
            if self.waiting == count:
                return

    def stop_intake(self) -> None:
        """Refuse new jobs from now on; those queued and running go on."""
        with self._cond:
            self._accepting = False

    def cancel_all(self) -> None:
        """End every queued and running job at its next step, as if its client had left (``cancelled``)."""
        with self._cond:
            for job in [*self.scheduler.waiting, *self.scheduler.placed.values()]:
                job.cancelled.set()
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking jobs, finish every queued and running one, and end the thread."""
        with self._cond:
            self._accepting, self._closing = False, True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self.scheduler.waiting and not self.runner.groups and not self._closing:
                    self._cond.wait()
                if self._closing and not self.scheduler.waiting and not self.runner.groups:
                    return
                if not self.runner.groups:
                    self._gather()
                order = self.scheduler.schedule()
            began = time.perf_counter()
            result = self.runner.execute(order)
            self.step_seconds.append(time.perf_counter() - began)
            with self._cond:  # it puts jobs back in the queue, which submit and cancel_all read
                self.scheduler.update(result)
            if self.on_step is not None:
                self.on_step(self)
