"""Continuous depth batching: jobs whose rows run at different loops of different tokens in one core call.

A :class:`~looplab.serve.continuous_group.ContinuousGroup` steps a token of every row at once, so its step takes
as many sequential core calls as its deepest row's token needs, the later ones over the few rows still
running (each call reads every weight however few rows it runs). A :class:`DepthGroup` is the server's form
of depth-wise batching (:mod:`looplab.generation.depthwise`): each core call advances every running row by
one loop of its own token, row a at loop 3 of its 10th token beside row b at loop 1 of its 2nd, and an
engine step runs core calls until some row's token exits. A row whose token exits is read (the coda, the
head), its job picks the next token (greedy, sampled with its own generator, or forced when scoring), and
that token joins the next call at loop 1. So a job's tokens cost the loops its own tokens run, whatever the
other rows' exits, and newcomers join between two calls, into a free row, prefilled there. (What it gains
is measured in bench/serve_published.py and bench/serve.py: a prompt still runs, lazily, as deep as its
row's deepest token, each loop in the core call that takes one of its tokens there; a newcomer's prefill runs
loop 1, and its query token's later loops run in the group's calls, beside the other rows' tokens.)

Each row stops by its own job's exit up to its own loop cap, as in a continuous group; each row's new
tokens go into its own slots from the first new-token slot on (a row a newcomer takes starts there again).
A row's tokens are the step decoder's for its prompt alone within float rounding (batched matmuls, sums
over more masked keys; tested), as continuous batching's are.

Rows of both cache policies of POOLED_POLICIES share a group, in one core call: the decoder's cache is per-loop
stacks, a ``per_loop`` job's row reads its own loop's keys and values, and a ``shared`` job's row reads every
earlier token at the last loop it ran, which the stacks hold at the row's cap (an exited token's entries are
lent up to it; its prompt runs to its cap at once) — what a shared store holds, at the per-loop stacks' memory.
Given the runner's pager, the rows' keys and values are paged in its pool instead (:mod:`looplab.serve.pager`),
the core's per-loop tables indexed by each row's loop as the stacks are: a row holds blocks for the slots it
has written (a new token's when it starts), a ``shared`` job's row one store across loops (its later loops'
tables point at loop 1's blocks, which its token writes at its own loop and the others read at its cap),
and a token that needs blocks the pool cannot give preempts the latest admitted job, of this group or another.

What it takes (:func:`depth_batchable`): the ``step`` decoder, a ``per_loop`` or ``shared`` cache, a model
whose passes run as chains of layers (``Capabilities.chains``), and, for an exit that reads each loop's
logits, no coda (the coda runs at a token's exit only). No prefix caching here: a kept prefix is a
continuous group's (:mod:`looplab.serve.prefixes`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.generation.cache import kv_shape
from looplab.generation.depthwise import DepthwiseDecoder
from looplab.generation.views import decodable
from looplab.serve.batch import POOLED_POLICIES, End, Job, JoinableRows, cohort_across_caches
from looplab.serve.whole_group import STEPPED
from looplab.tasks.base import PAD

__all__ = ["DepthGroup", "depth_batchable"]


def depth_batchable(model, job: Job) -> bool:
    """Whether ``job`` may run in a :class:`DepthGroup` on ``model`` (see the module docstring)."""
    options, rule = job.options, job.options.exit_rule
    if options.decoder != STEPPED or options.cache not in POOLED_POLICIES or job.cohort[-1] is not None:  # read-only
        return False
    view = decodable(model, gated=rule.needs_gate)
    return view.capabilities.chains and not (rule.reads_logits and len(view.coda))


class DepthGroup(JoinableRows):
    """Jobs of one cohort whose rows each run at their own loop (see the module docstring).

    The arguments are a :class:`~looplab.serve.continuous_group.ContinuousGroup`'s but for its prefix store:
    ``capacity`` rows, ``columns`` new-token slots a row, ``width`` prompt slots and loop ``cap``, each at least
    what the first ``jobs`` need. :attr:`live` are the rows whose token exited, with their
    next-token ``logits`` and exit ``depths``: picked at the next :meth:`step`.
    """

    #: a row's new tokens start at the first new-token slot again when a newcomer takes it
    COLUMNS_PER_BUDGET = 1
    #: the decoder's cache: per-loop stacks, which a ``shared`` job's row reads at its cap
    CACHE = "per_loop"
    #: per_loop and shared jobs together (paged, a shared job's row keeps one store across loops)
    pooled = True
    KIND = "depth"

    @classmethod
    def from_plan(cls, model, plan, prefixes=None, pager=None) -> DepthGroup:
        """The group a scheduler's plan (:class:`~looplab.serve.messages.GroupPlan`) asks for (no prefixes), its
        keys and values paged in ``pager``'s pool."""
        return cls(model, list(plan.jobs), plan.rows, plan.columns, plan.width, plan.cap, pager)

    @staticmethod
    def cohort_of(job: Job) -> tuple:
        """Jobs of either cache policy of POOLED_POLICIES share a group: the cohort but for the cache."""
        return cohort_across_caches(job)

    def __init__(
        self,
        model,
        jobs: list[Job],
        capacity: int,
        columns: int,
        width: int = 0,
        cap: int = 0,
        pager=None,
    ):
        first = jobs[0]
        capacity = self.size(model, jobs, capacity, columns, width, cap)
        view = decodable(model, gated=first.options.exit_rule.needs_gate)
        rule, options = first.options.exit_rule, first.options.but(cache=self.CACHE)
        self.pager = pager
        pool = None if pager is None else pager.pool_for(*kv_shape(view), view.head.weight.device)
        self.decoder = DepthwiseDecoder(
            view, [[PAD]] * capacity, self.columns, options, width=self.width, exits=[rule] * capacity, cap=self.cap,
            pool=pool,
        )  # fmt: skip
        self.decoder.slots.real[:] = False  # every row free (a padding prompt, unreal) until a job takes it
        self.state = self.decoder.in_flight()
        self.jobs: list[Job | None] = [None] * capacity
        self.live = torch.zeros(0, dtype=torch.long, device=self.decoder.lengths.device)
        self.logits = self.depths = None
        self.first = jobs

    @property
    def done(self) -> bool:
        return len(self.live) == 0 and not bool(self.state.running.any())

    @property
    def held(self) -> int:
        return sum(job is not None for job in self.jobs)

    def abandon(self) -> None:
        super().abandon()
        self.state.running[:] = False

    def begin(self) -> None:
        """Prefill the first jobs (once the group's bytes are reserved)."""
        self.join(self.first)

    def columns_left(self) -> int:
        return self.columns  # a row a newcomer takes starts its new tokens at the first new-token slot

    def join(self, jobs: list[Job]) -> None:
        """Prefill each of ``jobs``' prompts into a free row (in one forward pass); their first tokens are picked at
        the next :meth:`step`, or, where a query token runs on past loop 1, when it exits in a later one. A
        ``shared`` job's row reads as that policy does (``DepthwiseDecoder.take``). Paged, jobs whose
        prompts' blocks the pool cannot give now, and every one after them, go back to the queue."""
        jobs = self._granted(jobs)
        if not jobs:
            return
        rows = []
        for job in jobs:
            row = self.jobs.index(None)
            self.jobs[row] = job
            rows.append(row)
        index = torch.tensor(rows, device=self.live.device)
        shared = torch.tensor([job.options.cache == "shared" for job in jobs], device=index.device)
        prompts, exits = [job.prompt for job in jobs], [job.options.exit_rule for job in jobs]
        try:
            ready = self.decoder.take(self.state, index, prompts, exits, shared)
        except Exception:  # their prefill failed (the runner fails the jobs): the rows are free again
            self.state.running[index] = False  # (a query token handed on before the failure included)
            for row in rows:
                self.release(row)
            raise
        self._ready(*ready)  # the others' query tokens are in flight: picked when they exit

    def _start(self, rows: Tensor, tokens: Tensor) -> None:
        """Start each of ``rows``' next token [R] at loop 0 of its next slot; paged, with the blocks of those slots,
        the latest admitted jobs preempted for them (a preempted row of these starts nothing)."""
        if self.pager is not None:
            self.live, self.logits, self.depths = rows, None, None  # the rows whose preemption ``leave`` reads
            cache = self.decoder.cache
            self.pager.ensure(lambda: cache.blocks_needed_at(self.live, self.state.slot[self.live] + 1))
            kept = torch.isin(rows, self.live)
            rows, tokens = rows[kept], tokens[kept]
        if len(rows):
            self.decoder.start_tokens(self.state, rows, tokens)

    def leave(self, row: int) -> None:
        """Free ``row`` (its blocks given back, a token it has in flight dropped) and take it out of the live rows."""
        self.state.running[row] = False
        super().leave(row)

    def _ready(self, rows, logits, depths) -> None:
        """Rows [R] whose next token is to be picked from ``logits`` [R, V], read after ``depths`` [R] loops."""
        if self.logits is not None and len(self.live):
            rows, logits, depths = (
                torch.cat([self.live, rows]),
                torch.cat([self.logits, logits]),
                torch.cat([self.depths, depths]),
            )
        order = rows.argsort()
        self.live, self.logits, self.depths = rows[order], logits[order], depths[order]

    def drop_cancelled(self) -> None:
        """Jobs whose client left stop here, whether their row waits to pick or has a token in flight."""
        for row in self.state.running.nonzero(as_tuple=True)[0].tolist():
            if self.jobs[row].cancelled.is_set():
                self.jobs[row].send(End("cancelled"))
                self.state.running[row] = False
                self.release(row)
        super().drop_cancelled()

    def step(self) -> None:
        """Pick the next token of every row whose token exited (sending it, freeing the rows that ended) and
        start the rest's, then run core calls, one loop of every row's token in flight each, until a token
        exits (so that a step gives tokens, as a continuous group's does, beside which it runs)."""
        self.drop_cancelled()
        if len(self.live):
            chosen = self.choose()
            still = self.record(chosen)
            if still:
                keep = torch.tensor(still, device=self.live.device)
                self._start(self.live[keep], chosen[keep])
            self.live = self.live[:0]
        while self.state.running.any():
            exited, logits = self.decoder.advance(self.state)
            if len(exited):
                self._ready(exited, logits, self.state.loop[exited])
                return
