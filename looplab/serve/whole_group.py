"""A job whose decoder the engine does not step: :class:`WholeGroup` runs it whole through
:func:`looplab.generation.generate`.

The engine steps the ``step`` decoder one token at a time beside other jobs, and the ``speculative`` one a
round at a time (:mod:`looplab.serve.speculative_group`). The other decoders (``depth``, ``wavefront``,
``recompute``, a plugin's) each own their loop over tokens,
so a request naming one runs alone: its whole decode is one engine iteration, and its tokens are sent
together when it ends (a stream gets them in one burst). The other jobs wait for that iteration, as
they wait for a long prefill; ``--max-token-loops`` bounds both. Its tokens, depths and
log-probabilities are those of ``generate`` with the same options on the prompt alone.
"""

from __future__ import annotations

import torch

from looplab.generation.entry import generate
from looplab.serve.batch import End, Job, LiveRows, Token

__all__ = ["WholeGroup", "STEPPED"]

#: the decoder whose steps the engine runs from outside, beside other jobs'
STEPPED = "step"


class WholeGroup(LiveRows):
    """One job decoded whole at its first :meth:`step` (see the module docstring); ``live`` [1] until then.
    Its KV bytes are the job's alone (:func:`~looplab.serve.ledger.job_bytes`)."""

    KIND = "whole"

    @classmethod
    def from_plan(cls, model, plan, prefixes=None, pager=None) -> WholeGroup:
        """The group a scheduler's plan (:class:`~looplab.serve.messages.GroupPlan`) asks for: its one job."""
        return cls(model, plan.jobs[0])

    def __init__(self, model, job: Job):
        self.model, self.jobs = model, [job]
        self.live = torch.zeros(1, dtype=torch.long)

    def begin(self) -> None:
        """Nothing to prefill: the job runs whole at its first step."""

    def cache_bytes(self) -> int:
        """Nothing held between iterations: the job's decoder lives inside its one step."""
        return 0

    def step(self) -> None:
        """Decode the job (unless its client left), send each token, then its end."""
        (job,) = self.jobs
        self.live = self.live[:0]
        if job.cancelled.is_set():
            job.send(End("cancelled"))
            return
        forced = None if job.forced is None else [job.forced]
        budget = job.max_new if job.forced is None else len(job.forced)
        out = generate(self.model, [job.prompt], budget, job.options, finished=job.stops, forced=forced)
        for token, depth, logprob in zip(out.tokens[0], out.depths[0], out.logprobs[0], strict=True):
            job.tokens.append(token)
            job.send(Token(token, logprob, depth, []))
        job.send(End(job.ended() or "length"))
