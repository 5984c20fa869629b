"""Continuous batching: jobs that share a cache policy and a decoder run as rows of one
:class:`~looplab.generation.step.Decoder`, and a newcomer joins the running batch between two steps.
Each row stops by its own job's exit, up to its own loop cap (the loop runs to the largest cap the group
holds, a row leaving it when its token exits), and its token is picked by its own job (greedy, or its
temperature, top-k, top-p and seeded generator, or its forced token when scoring): greedy, sampled and
scoring jobs at any exit share every forward pass.

A :class:`ContinuousGroup` preallocates ``capacity`` rows and, after the prompts' ``width`` slots, ``columns``
slots for new tokens. Every step writes each live row's new token into the same slot column (the decoder's
``forward`` takes one slice for every row), each at the row's own position. A job that joins takes a free row:
its prompt is written into the row's first slots and prefilled there, and its new tokens go into the columns
from the current one on; the columns before it were another job's and are no longer real in that row, so
nothing attends to them. With an adaptive exit each row's prompt runs only as deep as its tokens need (the
decoder's lazy prompt, one per row, a newcomer's taking its row's place). A job joins when a row is free, its
prompt fits ``width`` and its budget fits the columns left; otherwise the engine starts a new group. A row
whose job ends is free at once. Given the runner's pager, the rows' keys and values are paged in its pool
(:mod:`looplab.serve.pager`): a row holds blocks for the slots it has written, and a step that needs blocks
the pool cannot give preempts the latest admitted job, of this group or another. A paged group takes the jobs
of the ``per_loop`` and the ``shared`` cache together (:func:`pooled_cohort`): its decoder's cache is per-loop,
and a shared job's row keeps one store across loops (:meth:`KVCache.assign
<looplab.generation.cache.KVCache.assign>`), so its tokens are those of its own shared cache.

What is shared is every matmul of a step, across the rows; a row's result then differs from the same prompt
decoded alone in its last float bits (batched matmuls, softmaxes over more masked keys), so greedy tokens
agree and log-probabilities match to ~1e-6, not bit for bit (``batching="exact"`` keeps that). A sampled
row draws with its own generator from its own row's probabilities, so its tokens are those drawn alone
unless a draw falls within that float noise of the boundary between two tokens (a chance of about 1e-6
per token).
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.generation.cache import kv_shape
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from looplab.serve.batch import POOLED_POLICIES, Job, JoinableRows, cohort_across_caches
from looplab.serve.pager import Pager
from looplab.serve.prefixes import PrefixStore
from looplab.tasks.base import PAD

__all__ = ["ContinuousGroup", "pooled_cohort"]


def pooled_cohort(model, job: Job) -> tuple:
    """The cohort of ``job`` in a paged continuous group. Jobs of either cache policy of POOLED_POLICIES share one
    where the model's passes are chains of layers (every core call's keys and values are then pool blocks,
    which a ``shared`` job's row keeps one of across loops: :meth:`KVCache.assign
    <looplab.generation.cache.KVCache.assign>`), but for the read-only exit's; the job's own cohort else."""
    if job.options.cache not in POOLED_POLICIES or job.cohort[-1] is not None:
        return job.cohort
    if not decodable(model, gated=job.options.exit_rule.needs_gate).capabilities.chains:
        return job.cohort
    return cohort_across_caches(job)


class ContinuousGroup(JoinableRows):
    """Jobs of one cohort in one decoder that newcomers join (see the module docstring).

    Args:
        model: the engine's model, as the decoder reads it.
        jobs: the first jobs (one :attr:`~looplab.serve.batch.Job.cohort`).
        capacity: the rows to preallocate (the scheduler's sizing: :mod:`looplab.serve.scheduler`).
        columns: the new-token slots after the prompts (at least the first jobs' largest budget).
        width: the prompt slots (at least the first jobs' longest prompt): room for later, longer prompts.
        cap: the loops a row may run (at least the first jobs' largest cap): room for later, deeper exits.
        prefixes: the runner's prefix store.
        pager: the runner's paged KV pool (:class:`~looplab.serve.pager.Pager`), or None for caches of the
            group's own. Nothing runs until :meth:`begin`.
    """

    #: new-token slots a group is sized for per budget: every row writes the same column, so a job that joins
    #: later needs its budget after the column the group stands at
    COLUMNS_PER_BUDGET = 2
    KIND = "continuous"

    @classmethod
    def from_plan(cls, model, plan, prefixes=None, pager=None) -> ContinuousGroup:
        """The group a scheduler's plan (:class:`~looplab.serve.messages.GroupPlan`) asks for, reading and
        keeping prefixes in ``prefixes``, its keys and values paged in ``pager``'s pool."""
        return cls(model, list(plan.jobs), plan.rows, plan.columns, plan.width, plan.cap, prefixes, pager)

    def __init__(
        self,
        model,
        jobs: list[Job],
        capacity: int,
        columns: int,
        width: int = 0,
        cap: int = 0,
        prefixes: PrefixStore | None = None,
        pager: Pager | None = None,
    ):
        options = jobs[0].options
        capacity = self.size(model, jobs, capacity, columns, width, cap)
        if pager is not None:
            self.cohort = pooled_cohort(model, jobs[0])
        # per_loop and shared jobs together: the decoder's cache is per-loop, a shared job's row keeps one store
        self.pooled = self.cohort[0] == POOLED_POLICIES
        if self.pooled:
            options = options.but(cache="per_loop")
        loops = self.cap
        model = decodable(model, gated=options.exit_rule.needs_gate)
        # prefix caching under a per-loop cache, each row's keys and values its own loops' (not read-only's)
        self.prefixes = prefixes if prefixes is not None and options.policy.per_loop and not self.cohort[-1] else None
        self.pager = pager
        pool = None if pager is None else pager.pool_for(*kv_shape(model), model.head.weight.device)
        # every row free at first (a padding prompt, unreal), then the first jobs join as later ones do
        self.decoder = Decoder(
            model, [[PAD]] * capacity, self.columns, options, width=self.width, exits=[options.exit_rule] * capacity,
            cap=loops, pool=pool,
        )  # fmt: skip
        self.decoder.slots.real[:] = False
        self.jobs: list[Job | None] = [None] * capacity
        self.column = 0  # the next new token's slot is width + column, for every live row
        self.live = torch.zeros(0, dtype=torch.long, device=self.decoder.lengths.device)
        self.logits = self.depths = None
        self.first = jobs

    def begin(self) -> None:
        """Prefill the first jobs (once the group's bytes are reserved: kept prefixes take what is left)."""
        self.join(self.first)

    def columns_left(self) -> int:
        return self.columns - self.column

    def join(self, jobs: list[Job]) -> None:
        """Prefill each of ``jobs``' prompts into a free row, after the kept prefix it begins with; their first
        tokens are picked at the next :meth:`step`. A job whose prompt begins with an earlier one's first block
        waits for that one's blocks to be kept (:meth:`_leaders`). Jobs whose prompts' blocks the pool cannot
        give now, and every one after them, go back to the queue (the pager's ``preempted``, with no token
        sent). Where a prefill fails (the runner fails these jobs), all their rows are free again."""
        jobs = self._granted(jobs)
        try:
            for batch in self._leaders(jobs):
                if batch:
                    self._admit(batch)
        except Exception:  # every row of these jobs is free again, those already prefilled too (the runner fails them)
            for row, owner in enumerate(self.jobs):
                if owner is not None and any(owner is job for job in jobs):
                    self.leave(row)
            raise

    def _admit(self, jobs: list[Job]) -> None:
        """Prefill ``jobs`` into free rows, those after a kept prefix of one length in one forward pass."""
        decoder, device = self.decoder, self.decoder.lengths.device
        rows = []
        for job in jobs:
            rows.append(self.jobs.index(None))
            self.jobs[rows[-1]] = job
        shared = torch.tensor([self._one_store(job) for job in jobs], device=device)
        exits = [job.options.exit_rule for job in jobs]
        decoder.place(torch.tensor(rows, device=device), [job.prompt for job in jobs], exits, shared)
        starts: dict[int, list[int]] = {}
        for row, job in zip(rows, jobs):
            hit = self._keeps(job) and self.prefixes.find(self.cohort, job.options.exit_rule.loops, job.prompt)
            if hit:
                decoder.cache.fill_slots(torch.tensor([row], device=device), 0, hit.state)
            starts.setdefault(hit.tokens if hit else 0, []).append(row)
        for start, rows in starts.items():
            members = [self.jobs[row] for row in rows]
            index = torch.tensor(rows, device=device)
            full = self._full(members)
            if start and full is not None:
                full = torch.ones_like(full)  # a row after a kept prefix: its prompt is not deepened later
            logits, depths = decoder.enter(index, start, full)
            if self.logits is not None:
                logits, depths = torch.cat([self.logits, logits]), torch.cat([self.depths, depths])
            live = torch.cat([self.live, index])
            order = live.argsort()  # rows in order: a full batch's caches are then read by slices
            self.live, self.logits, self.depths = live[order], logits[order], depths[order]
            if full is not None:  # the rows whose prompts ran to their caps: a lazy prompt's later loops are unrun
                ran = [row for row, whole in zip(rows, full.tolist()) if whole or not decoder.lazy_prompt]
                self._keep([row for row in ran if self._keeps(self.jobs[row])])

    def _leaders(self, jobs: list[Job]) -> tuple[list[Job], list[Job]]:
        """``jobs`` in two batches prefilled one after the other: a job whose first block is kept, or is an
        earlier job's first block, goes in the second (by then its prefix is kept)."""
        if self.prefixes is None:
            return jobs, []
        leaders, followers, heads = [], [], set()
        for job in jobs:
            if not self._keeps(job):  # it reads no kept prefix, and keeps none for a later one
                leaders.append(job)
                continue
            head = tuple(job.prompt[: self.prefixes.block]) if self.prefixes.whole_blocks(job.prompt) else None
            known = head is not None and (head in heads or self.prefixes.has_first(self.cohort, job, head))
            (followers if known else leaders).append(job)
            if head is not None:
                heads.add(head)
        return leaders, followers

    def _full(self, jobs: list[Job]) -> Tensor | None:
        """[R] bool: which of ``jobs``' prompts run to their row's cap, so that their whole blocks can be kept:
        those at a fixed exit, which run there anyway (an adaptive exit's prompt runs only as deep as its
        tokens need: it reads kept blocks, but keeps none). None without a store."""
        if self.prefixes is None:
            return None
        full = [
            self._keeps(job) and self.prefixes.whole_blocks(job.prompt) > 0 and not job.options.exit_rule.adaptive
            for job in jobs
        ]
        return torch.tensor(full, device=self.live.device)

    def _keeps(self, job: Job) -> bool:
        """Whether ``job`` reads and keeps prefixes: a group with a store, and the job's own cache per-loop (a
        shared job's rows hold one loop's keys and values)."""
        return self.prefixes is not None and job.options.policy.per_loop

    def _keep(self, rows: list[int]) -> None:
        """Keep the whole blocks of the prompts just prefilled in ``rows`` to their caps."""
        if not self.decoder.cache.slots_only():  # a family whose calls keep more than keys and values
            self.prefixes = None
            return
        for row in rows:
            job = self.jobs[row]
            self.prefixes.keep(self.cohort, job.options.exit_rule.loops, job.prompt, self.decoder, row)

    def step(self) -> None:
        """Pick every live row's next token, send it, free the rows that ended, and run the rest's tokens."""
        self.drop_cancelled()
        if self.done:
            return
        decoder = self.decoder
        chosen = self.choose()
        still = self.record(chosen)
        slot = self.width + self.column
        self.column += 1
        if not still:
            self.live = self.live[:0]
            return
        keep = torch.tensor(still, device=self.live.device)
        self.live, chosen = self.live[keep], chosen[keep]
        positions = self._positions()
        if self.pager is not None:  # the blocks of this step's slot, the latest admitted jobs preempted for them
            self.logits, self.depths = self.logits[keep], self.depths[keep]  # the live rows', as preempt reads them
            going = self.live
            decoder.start(self.live, slot, positions)  # a real slot now: the pool's blocks are for real ones
            self.pager.ensure(lambda: decoder.cache.blocks_needed(self.live, slice(slot, slot + 1)))
            if len(self.live) < len(going):
                kept = torch.isin(going, self.live)
                chosen, positions = chosen[kept], positions[kept]
            if self.done:
                return
        self.logits, self.depths = decoder.step(self.live, chosen, slot, positions)

    def _positions(self) -> Tensor:
        """[R] the position in its row of each live row's new token (its prompt's length plus the tokens before)."""
        made = torch.tensor([len(self.jobs[row].tokens) for row in self.live.tolist()], device=self.live.device)
        return self.decoder.lengths[self.live] + made - 1
