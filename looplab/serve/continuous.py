"""Continuous batching: greedy jobs that share an exit and a cache run as rows of one
:class:`~looplab.generation.decoder.Decoder`, and a newcomer joins the running batch between two steps.

A :class:`ContinuousGroup` preallocates ``capacity`` rows and, after the prompts' ``width`` slots,
``columns`` slots for new tokens. Every step writes each live row's new token into the same slot column (the
decoder's ``forward`` takes one slice for every row), each at the row's own position. A job that joins takes
a free row: its prompt is written into the row's first slots and prefilled there, and its new tokens go
into the columns from the current one on; the columns
before it were another job's and are no longer real in that row, so nothing attends to them. With an
adaptive exit each row's prompt runs only as deep as its tokens need (the decoder's lazy prompt, one per
row, a newcomer's taking its row's place). A job joins when a row is free, its prompt fits ``width`` and its
budget fits the columns left; otherwise the engine starts a new group. A row whose job ends is free at once.

What is shared is every matmul of a step, across the rows; a row's result then differs from the same prompt
decoded alone in its last float bits (batched matmuls, softmaxes over more masked keys), so greedy tokens
agree and log-probabilities match to ~1e-6, not bit for bit (``batching="exact"`` keeps that).
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.generation.budget import generation_bytes
from looplab.generation.decoder import Decoder, LazyPrompt
from looplab.generation.views import decodable
from looplab.memory import device_bytes
from looplab.serve.batch import Job, LiveRows
from looplab.serve.sampling import pick_next
from looplab.tasks.base import PAD

__all__ = ["ContinuousGroup"]


class ContinuousGroup(LiveRows):
    """Greedy jobs of one cohort in one decoder that newcomers join (see the module docstring).

    Args:
        model: the engine's model, as the decoder reads it.
        jobs: the first jobs (one cohort: the same exit, cache and greedy picking; none scoring a text).
        capacity: the rows to preallocate (the engine's sizing: ``Engine._continuous_group``), fewer where
            they would not fit in memory at ``columns`` new-token slots.
        columns: the new-token slots after the prompts (at least the first jobs' largest budget).
        width: the prompt slots (at least the first jobs' longest prompt): room for later, longer prompts.
    """

    def __init__(self, model, jobs: list[Job], capacity: int, columns: int, width: int = 0):
        first = jobs[0]
        self.cohort = first.cohort
        self.width = max(width, *(len(job.prompt) for job in jobs))
        self.columns = max(columns, max(job.max_new for job in jobs))
        options = first.options
        model = decodable(model, gated=options.exit_rule.needs_gate)
        loops, cache, params = options.exit_rule.loops, options.cache, options.cache_params
        while capacity > len(jobs):  # rows that do not fit leave room for another group instead
            needed = generation_bytes(model, capacity, self.width, self.columns, loops, cache, params)
            if 2 * needed <= device_bytes(str(model.head.weight.device)):
                break
            capacity = max(len(jobs), capacity // 2)
        prompts = [job.prompt for job in jobs] + [[PAD]] * (capacity - len(jobs))
        self.decoder = decoder = Decoder(model, prompts, self.columns, options, width=self.width)
        decoder.slots.real[len(jobs) :] = False
        self.jobs: list[Job | None] = [*jobs, *([None] * (capacity - len(jobs)))]
        self.column = 0  # the next new token's slot is width + column, for every live row
        self.live = torch.arange(len(jobs), device=decoder.lengths.device)
        self.logits, self.depths = decoder.prefill(self.live)
        if decoder.prompt is not None:  # a lazy prompt (an adaptive exit) for every row, the free ones at the cap
            decoder.prompt = _padded(decoder.prompt, capacity, loops)

    def can_take(self, job: Job) -> bool:
        """Whether ``job`` may join now: its cohort, a free row, a prompt within the width, a budget within the
        columns left."""
        return (
            job.cohort == self.cohort
            and any(owner is None for owner in self.jobs)
            and len(job.prompt) <= self.width
            and self.column + job.max_new <= self.columns
        )

    def join(self, job: Job) -> None:
        """Prefill ``job``'s prompt into a free row; its first token is picked at the next :meth:`step`."""
        decoder = self.decoder
        row = self.jobs.index(None)
        rows = torch.tensor([row], device=decoder.lengths.device)
        logits, depths = decoder.admit(rows, [job.prompt])
        self.jobs[row] = job
        self.live = torch.cat([self.live, rows])
        self.logits, self.depths = torch.cat([self.logits, logits]), torch.cat([self.depths, depths])

    def step(self) -> None:
        """Pick every live row's next token, send it, free the rows that ended, and run the rest's tokens."""
        self.drop_cancelled()
        if self.done:
            return
        decoder = self.decoder
        live = self.live.tolist()
        chosen = pick_next(self.logits, self.jobs[live[0]].picking, decoder.generator)
        still = self.record(chosen)
        slot = self.width + self.column
        self.column += 1
        if not still:
            self.live = self.live[:0]
            return
        keep = torch.tensor(still, device=self.live.device)
        self.live, chosen = self.live[keep], chosen[keep]
        made = torch.tensor([len(self.jobs[row].tokens) for row in self.live.tolist()], device=self.live.device)
        self.logits, self.depths = decoder.step(self.live, chosen, slot, decoder.lengths[self.live] + made - 1)

    def release(self, row: int) -> None:
        """The row is free for a newcomer."""
        self.jobs[row] = None


def _padded(prompt: LazyPrompt, rows: int, loops: int) -> LazyPrompt:
    """The lazy prompt of the first rows, padded to ``rows`` rows: the free ones stand at ``loops`` (never
    deepened) until a job's prompt takes their place."""
    extra = rows - prompt.h.shape[0]
    if extra == 0:
        return prompt

    def pad(t: Tensor, value=0) -> Tensor:
        return torch.cat([t, t.new_full((extra, *t.shape[1:]), value)])

    rope = None if prompt.rope is None else (pad(prompt.rope[0]), pad(prompt.rope[1]))
    depth = pad(prompt.depth, loops)
    return LazyPrompt(pad(prompt.h), pad(prompt.e), pad(prompt.allowed, False), rope, depth, int(depth.min()))
