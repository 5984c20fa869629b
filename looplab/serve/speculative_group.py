"""Self-speculative decoding stepped by the engine: a :class:`SpeculativeGroup` runs one draft-and-verify round
of its jobs per engine step, beside the other groups' steps.

The ``speculative`` decoder (:mod:`looplab.generation.speculative`) drafts n tokens at k loops and verifies
them at the exit's K loops in one batched pass, keeping the drafts K agrees with. Its jobs — greedy, at a
fixed exit, under ``per_loop`` — that arrive together and share a cohort and the exit's K (the same K, k and
n) are rows of
one :class:`~looplab.generation.speculative.SpeculativeDecoder`: its prefill commits each row's first token
at :meth:`SpeculativeGroup.begin`, and each :meth:`SpeculativeGroup.step` is one round, whose kept tokens are
sent at once. A job ends at its own budget or stop string (the round's tokens past it are not sent), or when
its client leaves. Rows' slots advance n a round together, so a job that arrives later starts a group of its
own. The tokens are fixed-K greedy decoding's, those of the same request alone (tested).
"""

from __future__ import annotations

from looplab.generation.speculative import SpeculativeDecoder, SpeculativeGeneration
from looplab.generation.views import decodable
from looplab.serve.batch import End, Job, Token
from looplab.serve.ledger import group_bytes

__all__ = ["SpeculativeGroup", "SPECULATIVE", "speculative_bytes"]

#: the decoder whose rounds the engine steps
SPECULATIVE = "speculative"


def speculative_bytes(model, jobs: list[Job]) -> int:
    """KV bytes a group of ``jobs`` holds: every row's prompt and n slots per new token."""
    options = jobs[0].options
    budget, width = max(job.max_new for job in jobs), max(len(job.prompt) for job in jobs)
    return group_bytes(
        model, jobs, len(jobs), width, budget * options.decoder_params.draft_tokens, options.exit_rule.loops
    )


class SpeculativeGroup:
    """Speculative jobs of one cohort, a round a step (see the module docstring); its KV bytes:
    :func:`speculative_bytes`."""

    KIND = "speculative"

    @classmethod
    def from_plan(cls, model, plan, prefixes=None, pager=None) -> SpeculativeGroup:
        """The group a scheduler's plan (:class:`~looplab.serve.messages.GroupPlan`) asks for."""
        return cls(model, list(plan.jobs))

    def __init__(self, model, jobs: list[Job]):
        options = jobs[0].options
        params, budget = options.decoder_params, max(job.max_new for job in jobs)
        view = decodable(model)
        prompts = [job.prompt for job in jobs]
        self.decoder = SpeculativeDecoder(view, prompts, budget, options, params.draft_loops, params.draft_tokens)
        self.jobs = jobs
        self.out = SpeculativeGeneration(*([[] for _ in jobs] for _ in range(3)))
        self.live: list[int] = list(range(len(jobs)))

    @property
    def done(self) -> bool:
        return not self.live

    @property
    def held(self) -> int:
        return len(self.live)

    def abandon(self) -> None:
        self.live = []

    def cache_bytes(self) -> int:
        return self.decoder.cache.nbytes()

    def begin(self) -> None:
        """Prefill every job's prompt and send its first token."""
        self.live = self._send(self.decoder.begin(self.out))

    def step(self) -> None:
        """One round of the live jobs (those whose client left end ``cancelled`` first); send what it kept."""
        for row in self.live:
            if self.jobs[row].cancelled.is_set():
                self.jobs[row].send(End("cancelled"))
        self.live = [row for row in self.live if not self.jobs[row].cancelled.is_set()]
        if self.live:
            self.live = self._send(self.decoder.round(self.out, self.live))

    def _send(self, still: list[int]) -> list[int]:
        """Send each job the tokens committed since the last send, up to its end; of the decoder's ``still``
        rows, those whose job goes on."""
        going = set(still)
        for row in self.live:
            job, tokens = self.jobs[row], self.out.tokens[row]
            reason = None
            for index in range(len(job.tokens), len(tokens)):
                job.tokens.append(tokens[index])
                job.send(Token(tokens[index], self.out.logprobs[row][index], self.out.depths[row][index], []))
                reason = job.ended()
                if reason is not None:
                    break
            if reason is None and row not in going:  # the decoder's own end: its budget for every row
                reason = "length"
            if reason is not None:
                job.send(End(reason))
                going.discard(row)
        return sorted(going)
