"""What the engine decodes: a :class:`Job` (one prompt's completion, or the scoring of a prompt) and a
:class:`Group` of jobs decoded together by one :class:`~looplab.generation.step.Decoder`.

A group is a Decoder stepped one token at a time from outside: :meth:`Group.step` is one iteration of
:meth:`Decoder.run <looplab.generation.step.Decoder.run>` (pick each live row's token, drop the rows that
ended, run the next token of the rest through ``Decoder.step``, the call ``run`` makes), so a group of one
job computes exactly what :func:`looplab.generation.generate` computes for its prompt alone, float for float.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from looplab.generation.options import DecodeOptions
from looplab.generation.sampling import Sampling
from looplab.generation.step import Decoder, StepParams
from looplab.generation.views import decodable
from looplab.serve.ledger import group_bytes, sized_rows
from looplab.serve.sampling import Picking, pick_rows

__all__ = ["Job", "Group", "JoinableRows", "LiveRows", "Room", "Token", "End", "Failed", "joinable_room", "solo_bytes"]

#: how a replaying row is picked (its token is then replaced by the one it replays: nothing is drawn)
REPLAYING = Picking(Sampling())


@dataclass(frozen=True)
class Token:
    """One new token of a job: its id, log-probability, the loops it ran, and the ``top`` likeliest
    (token, log-probability) pairs of the distribution it was read from (empty unless asked)."""

    token: int
    logprob: float
    depth: int
    top: list[tuple[int, float]]


@dataclass(frozen=True)
class End:
    """A job finished: ``stop`` (end-of-text or a stop string), ``length`` (its budget), or ``cancelled``."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """A job could not run (its decoder refused it); ``message`` is one line."""

    message: str


@dataclass
class Job:
    """One row to decode.

    Attributes:
        prompt: token ids (non-empty); ``max_new``: its budget of new tokens (≥ 1).
        options: its exit, cache, decoder (``step`` is stepped beside other jobs; another runs the job whole:
            :mod:`looplab.serve.whole_group`) and sampling (``picking``'s), each with its parameters.
        picking: how a token is picked; ``forced``: the tokens to feed instead (scoring a text).
        stops: called with the new ids after each token; True ends the job (``stop``).
        top: how many likeliest tokens each :class:`Token` lists (0: none).
        sink: called from the engine's thread with each :class:`Token`, then one :class:`End` or :class:`Failed`
            (the scheduler delivers what the runner's groups :meth:`send`).
        outbox: what the job's group sent since the runner last collected it.
        admitted: the scheduler's count of admissions when it was last placed (the latest is preempted first).
        replay: tokens it already sent, fed again without being sent after a preemption
            (:mod:`looplab.serve.pager`), the next first.
    """

    prompt: list[int]
    max_new: int
    options: DecodeOptions
    picking: Picking
    sink: Callable[[Token | End | Failed], None]
    stops: Callable[[list[int]], bool] | None = None
    forced: list[int] | None = None
    top: int = 0
    tokens: list[int] = field(default_factory=list)
    closed: bool = False  # its End or Failed was sent
    cancelled: threading.Event = field(default_factory=threading.Event)
    outbox: list[Token | End | Failed] = field(default_factory=list)
    admitted: int = 0
    replay: list[int] = field(default_factory=list)

    def send(self, event: Token | End | Failed) -> None:
        """Put ``event`` in the outbox (a group's only way to answer: the scheduler delivers it to the sink)."""
        self.outbox.append(event)
        self.closed = self.closed or isinstance(event, End | Failed)

    @cached_property
    def cohort(self) -> tuple:
        """Jobs with equal cohorts may share a decoder: the same cache policy and decoder, with their parameters,
        and the same view of the model (gated for the gate exit, or not). Exits, loop caps and sampling may
        differ: each row stops by its own job's exit and is picked by its own job (the read-only exit runs
        every row to the decoder's cap, so its jobs share their cap too). Worked out once, as the engine asks
        at each admission."""
        options, rule = self.options, self.options.exit_rule
        read_only = isinstance(options.decoder_params, StepParams) and options.decoder_params.read_only_exit
        same = (options.cache, repr(options.cache_params), options.decoder, repr(options.decoder_params))
        return (*same, rule.needs_gate, rule.loops if read_only else None)

    @cached_property
    def generator(self) -> torch.Generator | None:
        """The job's own sampling generator, seeded as :func:`looplab.generation.generate` seeds its one (None
        when the job picks greedily or is forced)."""
        if self.forced is not None or self.picking.greedy:
            return None
        return torch.Generator().manual_seed(self.picking.sampling.seed)

    def ended(self) -> str | None:
        """Why the job is done after its latest token, or None."""
        if self.forced is not None:
            return "length" if len(self.tokens) == len(self.forced) else None
        if self.stops is not None and self.stops(self.tokens):
            return "stop"
        return "length" if len(self.tokens) >= self.max_new else None


class LiveRows:
    """What every group of jobs shares: its ``jobs`` by decoder row, the ``live`` rows [R] with their next-token
    ``logits`` [R, V] and exit ``depths`` [R], the likeliest tokens a job asks for, and the jobs whose client
    left (a subclass frees their rows in :meth:`release`)."""

    jobs: list
    live: Tensor
    logits: Tensor
    depths: Tensor
    decoder: Decoder

    @property
    def done(self) -> bool:
        return len(self.live) == 0

    @property
    def held(self) -> int:
        """The jobs the group holds now."""
        return len(self.live)

    def abandon(self) -> None:
        """Hold no job from now on (the engine failed them all)."""
        self.live = self.live[:0]

    def cache_bytes(self) -> int:
        """Bytes the group's KV cache holds."""
        return self.decoder.cache.nbytes()

    def tops(self, logprobs: Tensor) -> list[list[tuple[int, float]]] | None:
        """The likeliest tokens of each live row's distribution (logprobs [R, V]), as many as its job asks."""
        count = max(self.jobs[row].top for row in self.live.tolist())
        if count == 0:
            return None
        values, ids = logprobs.topk(min(count, logprobs.shape[-1]), dim=-1)
        return [list(zip(ids[i].tolist(), values[i].tolist())) for i in range(len(ids))]

    def choose(self) -> Tensor:
        """[R] each live row's next token: its job's forced token or the next it replays (its generator drawing
        nothing), or one picked by its job's picking."""
        jobs = [self.jobs[row] for row in self.live.tolist()]
        pickings = [REPLAYING if job.replay else job.picking for job in jobs]
        chosen = pick_rows(self.logits, pickings, [None if job.replay else job.generator for job in jobs])
        for i, job in enumerate(jobs):
            if job.replay:
                chosen[i] = job.replay[0]
            elif job.forced is not None:
                chosen[i] = job.forced[len(job.tokens)]
        return chosen

    def drop_cancelled(self) -> None:
        """Jobs whose client left stop here: their rows leave the batch as a finished row would."""
        live = self.live.tolist()
        keep = [i for i, row in enumerate(live) if not self.jobs[row].cancelled.is_set()]
        if len(keep) == len(live):
            return
        for row in live:
            if self.jobs[row].cancelled.is_set():
                self.jobs[row].send(End("cancelled"))
                self.release(row)
        index = torch.tensor(keep, dtype=torch.long, device=self.live.device)
        self.live, self.logits, self.depths = self.live[index], self.logits[index], self.depths[index]

    def record(self, chosen: Tensor) -> list[int]:
        """Send each live row's token ``chosen`` [R] to its job, with its log-probability, the loops it ran and the
        likeliest tokens the job asks for; a job that ended is sent its :class:`End` and its row released.
        Returns the indices (into the live rows) of the jobs that go on."""
        logprobs = self.logits.double().log_softmax(-1)
        picked = logprobs.gather(1, chosen[:, None]).squeeze(1).tolist()
        tops = self.tops(logprobs)
        still = []
        for i, row in enumerate(self.live.tolist()):
            job = self.jobs[row]
            job.tokens.append(int(chosen[i]))
            if job.replay:  # sent before its preemption
                job.replay.pop(0)
                still.append(i)
                continue
            job.send(Token(int(chosen[i]), picked[i], int(self.depths[i]), tops[i][: job.top] if tops else []))
            reason = job.ended()
            if reason is None:
                still.append(i)
            else:
                job.send(End(reason))
                self.release(row)
        return still

    def release(self, row: int) -> None:
        """A row whose job ended (a group that never reuses rows keeps it as it is)."""


@dataclass(frozen=True)
class Room:
    """What a joinable group holds: ``rows``, prompt ``width``, new-token ``columns`` a row, loop ``cap``, and
    the KV bytes that takes."""

    rows: int
    width: int
    columns: int
    cap: int
    nbytes: int


def joinable_room(
    model, jobs: list[Job], capacity: int, columns: int, width: int, cap: int, memory=None, cache: str | None = None
) -> Room:
    """The room of a joinable group for ``jobs`` (one cohort): at least what they need, ``capacity`` rows, fewer
    where they would not fit in ``memory`` bytes (:func:`~looplab.serve.ledger.sized_rows`: DoesNotFit when
    the jobs' own rows do not), its caches under the jobs' policy or ``cache``."""
    width = max(width, *(len(job.prompt) for job in jobs))
    columns = max(columns, *(job.max_new for job in jobs))
    cap = max(cap, *(job.options.exit_rule.loops for job in jobs))

    def needed(rows: int) -> int:
        return group_bytes(model, jobs, rows, width, columns, cap, cache)

    rows, nbytes = sized_rows(needed, capacity, len(jobs), memory)
    return Room(rows, width, columns, cap, nbytes)


#: the cache policies whose jobs one joinable group may hold together: its cache per-loop, a ``shared`` job's
#: row reading (depth groups) or keeping (paged) what a shared store holds
POOLED_POLICIES = ("per_loop", "shared")


def cohort_across_caches(job: Job) -> tuple:
    """``job``'s cohort but for its cache policy (one of POOLED_POLICIES): what the jobs of a group that holds
    both policies share."""
    return (POOLED_POLICIES, None, *job.cohort[2:])


class JoinableRows(LiveRows):
    """A group that jobs of its cohort join between steps, into rows freed by jobs that ended: what a continuous
    and a depth group share. :meth:`size` sets its room (prompt ``width``, new-token ``columns``, loop
    ``cap``, :class:`Room`) and its rows; a subclass says how many columns a newcomer has left
    (:meth:`columns_left`). Whether a job may join is the scheduler's to say, from the group's state
    (:func:`looplab.serve.runner.group_state`)."""

    jobs: list[Job | None]
    #: the cache policy of the group's decoder (None: its jobs' own)
    CACHE: str | None = None
    #: the runner's paged KV pool (:class:`~looplab.serve.pager.Pager`), or None for caches of the group's own
    pager = None
    #: whether the group takes jobs of the per_loop and the shared cache together (a shared job's row then keeps
    #: one store across loops, paged)
    pooled = False

    @staticmethod
    def cohort_of(job: Job) -> tuple:
        """What the jobs of one group share (their :attr:`Job.cohort`)."""
        return job.cohort

    def size(self, model, jobs: list[Job], capacity: int, columns: int, width: int, cap: int) -> int:
        """Room for at least what ``jobs`` (one cohort) need, and ``capacity`` rows (:func:`joinable_room`); the
        rows it takes."""
        self.cohort = self.cohort_of(jobs[0])
        room = joinable_room(model, jobs, capacity, columns, width, cap, cache=self.CACHE)
        self.width, self.columns, self.cap = room.width, room.columns, room.cap
        return room.rows

    def columns_left(self) -> int:
        """The new-token slots a job joining now may fill."""
        raise NotImplementedError

    def _one_store(self, job: Job) -> bool:
        """Whether ``job``'s row keeps one store across loops: a ``shared`` job in a paged group of both policies."""
        return self.pooled and self.pager is not None and job.options.cache == "shared"

    def _granted(self, jobs: list[Job]) -> list[Job]:
        """The first of ``jobs`` whose prompts' blocks (each its own prompt's, at its own loop cap) the pager can
        give; the rest go back to the queue (the pager's ``preempted``, with no token sent)."""
        if self.pager is None:
            return jobs
        cache = self.decoder.cache
        for count in range(len(jobs), 0, -1):
            taking = jobs[:count]
            lengths, loops = [len(job.prompt) for job in taking], [job.options.exit_rule.loops for job in taking]
            if self.pager.grant(cache.blocks_for(lengths, loops, [self._one_store(job) for job in taking])):
                break
        else:
            count = 0
        self.pager.preempted.extend(jobs[count:])
        return jobs[:count]

    def release(self, row: int) -> None:
        """The row is free for a newcomer, its paged blocks given back."""
        self.jobs[row] = None
        self.decoder.cache.release(torch.tensor([row], device=self.decoder.lengths.device))

    def preempt(self, job: Job) -> None:
        """Free ``job``'s row and blocks (:mod:`looplab.serve.pager`): it leaves the live rows, and its tokens
        so far are what it replays when it is admitted again."""
        self.leave(next(row for row, owner in enumerate(self.jobs) if owner is job))
        job.replay, job.tokens = job.tokens + job.replay, []

    def leave(self, row: int) -> None:
        """Free ``row`` (its blocks given back) and take it out of the live rows, with its logits and depths
        where they are the live rows' (between steps, or a step's own once its live rows are cut)."""
        self.release(row)
        keep = self.live != row
        self.live = self.live[keep]
        if self.logits is not None and len(self.logits) == len(keep):
            self.logits, self.depths = self.logits[keep], self.depths[keep]

    def abandon(self) -> None:
        """Hold no job from now on (the engine failed them all): every row is free, its blocks given back."""
        for row, job in enumerate(self.jobs):
            if job is not None:
                self.release(row)
        super().abandon()


def solo_bytes(model, jobs: list[Job]) -> int:
    """KV bytes a :class:`Group` of ``jobs`` holds."""
    budget = max(len(job.forced) if job.forced is not None else job.max_new for job in jobs)
    width, cap = max(len(job.prompt) for job in jobs), max(job.options.exit_rule.loops for job in jobs)
    return group_bytes(model, jobs, len(jobs), width, budget, cap)


class Group(LiveRows):
    """Jobs decoded by one Decoder (one job each, unless the engine batches cohorts), prefilled by :meth:`begin`;
    each :meth:`step` emits one token per live job. Its KV bytes: :func:`solo_bytes`."""

    KIND = "solo"

    @classmethod
    def from_plan(cls, model, plan, prefixes=None, pager=None) -> Group:
        """The group a scheduler's plan (:class:`~looplab.serve.messages.GroupPlan`) asks for."""
        return cls(model, list(plan.jobs))

    def __init__(self, model, jobs: list[Job]):
        first = jobs[0]
        self.jobs = jobs
        self.budget = max(len(job.forced) if job.forced is not None else job.max_new for job in jobs)
        options = first.options
        model = decodable(model, gated=options.exit_rule.needs_gate)  # the gate exit reads a gated view
        rules = [job.options.exit_rule for job in jobs]
        exits = rules if len(set(rules)) > 1 else None  # one exit: the decoder generate runs, float for float
        self.decoder = decoder = Decoder(model, [job.prompt for job in jobs], self.budget, options, exits=exits)
        self.live = torch.arange(len(jobs), device=decoder.lengths.device)
        self.step_index = 0

    def begin(self) -> None:
        """Prefill the jobs' prompts."""
        self.logits, self.depths = self.decoder.prefill(self.live)

    def step(self) -> None:
        """Pick the next token of every live job, send it, and run the tokens of the jobs still going."""
        self.drop_cancelled()
        if self.done:
            return
        decoder, step = self.decoder, self.step_index
        chosen = self.choose()
        still = self.record(chosen)
        self.step_index += 1
        if step == self.budget - 1 or not still:
            self.live = self.live[:0]
            return
        keep = torch.tensor(still, device=self.live.device)
        self.live, chosen = self.live[keep], chosen[keep]
        positions = decoder.lengths[self.live] + step
        self.logits, self.depths = decoder.step(self.live, chosen, decoder.width + step, positions)
