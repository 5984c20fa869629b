"""Depth-wise batching: rows at different loops of different tokens share one core call.

The step-synchronous decoder (:mod:`looplab.generation.step`) runs a decode step's loops until
its deepest token exits, so a step costs as many sequential core calls as its deepest token's
loops, however few rows are still running. Here every row runs its own tokens at its own pace:
each core call advances every running row by one loop — row a at loop 3 of its 10th token beside
row b at loop 1 of its 12th — and a row whose token exits reads its next-token distribution, picks
its next token and joins the next call at loop 1 of it. A row's call count is the sum of its
tokens' depths, and the generation's is the largest row's, instead of the sum over steps of each
step's deepest token.

Bookkeeping. Under ``per_loop`` a core layer's keys and values of every loop are one tensor
[K, B, H_kv, S, Dh] (loop, row, head, slot), so a call writes and reads each row at its own loop by
indexing, with no grouping by loop. A token at loop t writes its keys and values to loops t..K:
the entries of loops it will not run are the ones an exited token lends (``per_loop``'s rule), and
a deeper loop overwrites its own. Slots are per row: a row's g-th new token is in slot W + g (W the
longest prompt), whichever call it runs in, and attends to its own row's slots up to it. When every
row of the batch is at one slot and loop (a fixed depth keeps them so) the caches are read and written
by slices, as the step decoder does; otherwise by gathers and scatters (measured in bench/depthwise.py).
Paged (a ``pool``: :meth:`KVCache.page <looplab.generation.cache.KVCache.page>`), a core layer's block tables
of every loop are one tensor [K, B, n] indexed the same way, and every call gathers and scatters: a token
writes loops t up to its own row's cap (its blocks end there), only t where its row keeps one store across
loops, and a new token takes its slot's blocks when it starts. (A pass's layer calls:
:class:`~looplab.generation.depth_calls.DepthCalls`.)

A prompt runs only as deep as its tokens need where the step decoder's does (``per_loop``, an adaptive
exit, no coda): a row's prompt runs loop t in the first call that takes one of its tokens to loop t, its
tokens laid beside the call's (:meth:`~looplab.generation.step.Decoder.core_call`), so the weights are read
once for both. Its prefill runs loop 1 alone: a prompt whose last token (the query, whose exit gives the
first new token) runs on is a token in flight like the others, each of its calls running the prompt's next
loop and reading the query there — not prefill passes of its own that every other row waits for.

Across requests (``max_batch``): that many rows decode at once; the row of a prompt that finishes is
given the next waiting one, prefilled there while the other rows keep their place.

The tokens are those of the step-synchronous decoder (the same sums per row; equal within float
rounding, tested in float64); sampled tokens draw from the seeded generator in the order rows pick,
which is not the step-synchronous order. What it takes: the ``per_loop`` cache and a model whose
passes are chains of pre-norm layers (a looplab model or a retrofit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.generation.decoders import DecodingMethod, register_decoder
from looplab.generation.depth_calls import DepthCalls
from looplab.generation.passes import coda_pass, logits_of, prelude_pass
from looplab.generation.sampling import Generation, choose, ended
from looplab.generation.step import Decoder
from looplab.generation.views import described
from looplab.params import at_least, param
from looplab.token_exits import Carried

__all__ = ["DepthwiseDecoder", "Depth", "InFlight", "check_depthwise"]


def check_depthwise(model, batching: str = "depth-wise batching") -> None:
    """One-line errors for a model (a decoding view) whose passes depth-wise batching (or ``batching``, a
    decoder built on it) cannot run."""
    if not model.capabilities.chains:
        raise LooplabError(
            f"{batching} runs chains of pre-norm layers, which {described(model)} is not: valid models: a looplab "
            "run, a retrofit, Ouro, Huginn-0125 or Nanbeige4.2"
        )


@dataclass
class DepthParams:
    max_batch: int = param(0, at_least(0), "prompts decoded at once, the others waiting for a finished row (0: all)")


@register_decoder
class Depth(DecodingMethod):
    """Each core call advances every running row by one loop of its own token (module docstring)."""

    name = "depth"
    Params = DepthParams
    caches = ("per_loop",)

    def check(self, model, prompts, max_new_tokens, options, sources) -> None:
        check_depthwise(model)
        if options.exit_rule.reads_logits and len(model.coda):
            raise LooplabError(
                f"the {options.exit_rule.name} exit reads each loop's logits, which follow the coda "
                f"({len(model.coda)} layers); the depth decoder runs the coda at a token's exit only: use the step "
                "decoder, or an exit that reads the state"
            )
        held = options.decoder_params.max_batch
        if held and held < len(prompts):  # rows held at once: max_batch of them, as wide as the longest prompt
            lengths = [len(prompt) for prompt in prompts]
            rows = sorted(sorted(range(len(prompts)), key=lengths.__getitem__)[-held:])
            sources = [sources[i] if sources else f"prompts[{i}]" for i in rows]
            prompts = [prompts[i] for i in rows]
        super().check(model, prompts, max_new_tokens, options, sources)

    def decode(self, model, prompts, max_new_tokens, options, finished, forced) -> Generation:
        max_batch = options.decoder_params.max_batch
        return DepthwiseDecoder(model, prompts, max_new_tokens, options, finished, forced, max_batch).run()


class DepthwiseDecoder(Decoder):
    """The cached decoder's prefill, then calls that advance each running row by one loop (module docstring)."""

    #: a lazy prefill runs loop 1 alone; a query token that runs on is a token in flight (:meth:`_hand_on`)
    HANDS_ON = True

    def __init__(
        self, model, prompts, max_new_tokens, options, finished=None, forced=None, max_batch=0, width=0, exits=None,
        cap=0, pool=None,
    ):  # fmt: skip
        batch = min(max_batch or len(prompts), len(prompts))
        width = max(width, *map(len, prompts))  # every prompt fits the rows' prompt slots, whichever row it takes
        first = prompts[:batch]
        super().__init__(model, first, max_new_tokens, options, finished, forced, width, exits, cap, pool)
        # the core's keys and values of every loop: dense stacks, or, paged, the tables of the pool's blocks
        self.stacks = [] if pool is not None else [self.cache.stack(index) for index in range(len(self.model.core))]
        #: [B] the rows that read every earlier token at its exit depth (``shared``'s reading, kept in the
        #: per-loop stacks: :meth:`take`), not at their own loop
        self.reads_cap = torch.zeros(len(self.lengths), dtype=torch.bool, device=self.lengths.device)
        self.prompts = prompts
        self.request = list(range(batch))  # row → the prompt it decodes now
        self.waiting = batch  # the next prompt to take a row

    def run(self) -> Generation:
        batch, device = len(self.lengths), self.lengths.device
        every = torch.arange(batch, device=device)
        state = self.in_flight()
        read = self._hand_on(state, every, *self.prefill(every))
        out = Generation(*([[] for _ in self.prompts] for _ in range(3)))
        starting = self._pick(out, state, *read)
        while True:
            if len(starting):
                latest = [out.tokens[self.request[row]][-1] for row in starting.tolist()]
                self.start_tokens(state, starting, torch.tensor(latest, device=device))
            if not state.running.any():
                break
            exited, logits = self.advance(state)
            starting = exited[:0]
            if len(exited):
                starting = self._pick(out, state, exited, logits, state.loop[exited])
        out.cache_bytes = self.cache.nbytes()
        return out

    def in_flight(self) -> InFlight:
        """No row with a token in flight (each row's next token goes into the first new-token slot)."""
        return InFlight.empty(len(self.lengths), self.width, self.lengths.device)

    def advance(self, state: InFlight) -> tuple[Tensor, Tensor]:
        """One core call: every running row's token one loop on. The rows whose token exited [X] and their
        next-token logits [X, V] (the coda run on their exit states first); each one's exit depth is
        ``state.loop`` there."""
        exited, exit_h = self._loop(state, state.running.nonzero(as_tuple=True)[0])
        if len(exited) and len(self.model.coda):
            exit_h = coda_pass(self.model, exit_h[:, None], self._calls("coda", exited, state.slot[exited]))[:, 0]
        return exited, logits_of(self.model, exit_h)

    def _pick(self, out: Generation, state: InFlight, rows: Tensor, logits: Tensor, depths: Tensor) -> Tensor:
        """Record each row's next token from its logits [R, V] (picked in row order); a row whose prompt is
        done takes the next waiting prompt. The rows that go on to a next token, in batch order."""
        go_on, free = [], []
        logprobs = logits.double().log_softmax(-1)
        for i, row in enumerate(rows.tolist()):
            request = self.request[row]
            step = len(out.tokens[request])
            token = int(choose(logits[i : i + 1], [request], step, self.forced, self.sampling, self.generator)[0])
            out.record(request, token, int(depths[i]), float(logprobs[i, token]))
            done = step + 1 >= self.max_new or ended(out.tokens[request], request, self.finished, self.forced)
            (free if done else go_on).append(row)
        free = free[: len(self.prompts) - self.waiting]
        if free:
            go_on += self._admit(out, state, torch.tensor(free, device=rows.device)).tolist()
        return torch.tensor(sorted(go_on), dtype=torch.long, device=rows.device)

    def _admit(self, out: Generation, state: InFlight, rows: Tensor) -> Tensor:
        """Give ``rows`` the next waiting prompts and prefill them there (their earlier slots are no longer
        real, so nothing attends to them); :meth:`_pick` their first tokens."""
        count = len(rows)
        prompts = self.prompts[self.waiting : self.waiting + count]
        for row, request in zip(rows.tolist(), range(self.waiting, self.waiting + count)):
            self.request[row] = request
        self.waiting += count
        return self._pick(out, state, *self.take(state, rows, prompts))

    def take(
        self, state: InFlight, rows: Tensor, prompts: list[list[int]], exits=None, shared: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Give ``rows`` [R] new prompts (and, where given, exits of their own) and prefill them there, their new
        tokens from the first new-token slot on (the earlier occupants' slots are no longer real, so nothing
        attends to them): the rows whose query token exited [X], with their next-token logits [X, V] and exit
        depths [X]; the others' query tokens are in flight (:meth:`_hand_on`).

        ``shared`` [R]: the rows read as the ``shared`` cache policy reads — every earlier token at the last loop
        it ran. The per-loop stacks hold that at the row's cap: an exited token lends its entries up to the cap,
        a token in flight writes its loop's from that loop up, and a prompt that ran to the cap holds its
        last loop's there, as a shared store would (their prompts run to their caps now, not lazily)."""
        state.slot[rows] = self.width - 1
        shared = torch.zeros(len(rows), dtype=torch.bool, device=rows.device) if shared is None else shared
        self.reads_cap[rows] = shared
        # paged, such a row keeps one store across loops (what it writes at every later loop lands there too)
        self.place(rows, prompts, exits, shared if self.cache.shares_loops() else None)
        return self._hand_on(state, rows, *self.enter(rows, full=shared if bool(shared.any()) else None))

    def _hand_on(self, state: InFlight, rows: Tensor, logits: Tensor, depths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """After a prefill of ``rows`` [R] (their logits [R, V] and depths [R]): the query tokens it handed on
        (:attr:`~looplab.generation.step.Decoder.handed`) are tokens in flight at loop 1, whose calls run their
        prompts' next loops (:meth:`_loop`); the other rows, with their logits and depths."""
        handed, self.handed = self.handed, None
        if handed is None:
            return rows, logits, depths
        on, go = handed.running, rows[handed.running]
        state.hold(go, handed.h)  # (its e is its prompt's: a query's calls are its prompt's)
        state.loop[go], state.running[go], state.query[go] = 1, True, True
        for rule, carried in handed.carried.states.items():
            state.carried.of(rule, go)  # (made where it was not)
            state.carried.put(rule, go, carried[on])
        if handed.logp is not None:
            state.logps(handed.logp)[go] = handed.logp
        return rows[~on], logits[~on], depths[~on]

    def start_tokens(self, state: InFlight, rows: Tensor, tokens: Tensor) -> None:
        """Put each row's latest token [R] in its next slot and run its prelude: the row is at loop 0 of it."""
        state.slot[rows] += 1
        slot = state.slot[rows]
        self.start(rows, slot, self.lengths[rows] + slot - self.width)
        self.cache.reserve_at(rows, slot)  # a paged cache's blocks for the new slots, before anything runs
        x = self.model.embedding(tokens[:, None])
        if self.model.positions is not None:
            x = x + self.model.positions.weight[self.slots.positions[rows, slot]][:, None]
        e = (
            prelude_pass(self.model, x, self._calls("prelude", rows, slot))[:, 0]
            if len(self.model.prelude)
            else x[:, 0]
        )
        state.hold(rows, self.model.initial_state(e), e)
        state.loop[rows] = 0
        state.running[rows], state.query[rows] = True, False
        state.carried.restart(rows)

    def _loop(self, state: InFlight, rows: Tensor) -> tuple[Tensor, Tensor]:
        """One loop of every running row's token, each at its own loop; the rows that exit and their states.

        A lazy prompt runs a loop when a later token of its row first needs it, in the same call; a row whose
        token in flight is its prompt's query (``state.query``: its prefill handed it on) runs its prompt's
        next loop in that call too (beside the other rows' tokens), and reads the query's state there."""
        loop = state.loop[rows] + 1
        h_prev, query = state.h[rows], state.query[rows]
        if not bool(query.any()):
            calls = self._calls("core", rows, state.slot[rows], loop)
            h = self.core_call(h_prev[:, None], state.e[rows][:, None], calls, rows, loop)[:, 0]
        else:
            tokens, queries, h = rows[~query], rows[query], h_prev.clone()
            if len(tokens):
                calls = self._calls("core", tokens, state.slot[tokens], loop[~query])
                h[~query] = self.core_call(h_prev[~query][:, None], state.e[tokens][:, None], calls, rows, loop)[:, 0]
            else:
                self.core_call(None, None, None, rows, loop)
            h[query] = self.prompt.h[queries, self.lengths[queries] - 1]
        logp = logits_of(self.model, h).log_softmax(-1) if self.exits.reads_logits(rows) else None
        earlier = None if logp is None else state.logps(logp)[rows]
        stop = self.exits.check_rows(rows, loop, h, h_prev, logp, earlier, state.carried)
        state.h[rows], state.loop[rows] = h, loop
        if logp is not None:
            state.logp[rows] = logp
        exited = rows[stop]
        state.running[exited] = False
        return exited, h[stop]

    def _calls(self, site: str, rows: Tensor, slot: Tensor, loop: Tensor | None = None) -> DepthCalls:
        """The layer calls of one pass of tokens in flight at ``site``, the token of batch row ``rows`` [R] in
        ``slot`` [R] (at core ``loop`` [R]): each one's mask over its row's slots up to its own, its RoPE tables,
        and how the caches are indexed."""
        key_slots = torch.arange(int(slot.max()) + 1, device=rows.device)
        allowed = (key_slots[None, :] <= slot[:, None]) & self.slots.real[rows, : len(key_slots)]
        window = self.model.cfg.attention_window
        if window > 0:
            query = self.slots.positions[rows, slot]
            allowed &= query[:, None] - self.slots.positions[rows, : len(key_slots)] <= window
        rope = None
        if self.rope is not None:
            positions = self.slots.positions[rows, slot]
            rope = (self.rope[0][positions][:, None], self.rope[1][positions][:, None])
        lockstep = None
        # rows come sorted (nonzero, or sorted lists), so every row of the batch is rows 0..B-1 in order; a row
        # that reads at its cap is read at another loop than it writes; paged blocks are indexed in any case
        paged = self.cache.pool is not None
        same = not paged and len(rows) == len(self.lengths) and bool((slot == slot[0]).all())
        if same and not bool(self.reads_cap.any()):
            if loop is None or bool((loop == loop[0]).all()):  # every row at one slot and loop: slices, no gathers
                lockstep = (int(slot[0]), 0 if loop is None else int(loop[0]))
        writes = None
        if loop is not None and lockstep is None:
            # (loop, row) pairs: the token's loop and every later one (what it lends when it exits there)
            loops = torch.arange(1, self.cap + 1, device=rows.device)[None, :]
            later = loops >= loop[:, None]
            if paged:  # a row's blocks end at its cap; one store across loops takes this loop's write alone
                last = torch.where(self.cache.loop_shared[rows], loop, self.exits.caps[rows])
                later &= loops <= last[:, None]
            which, loops = later.nonzero(as_tuple=True)
            writes = (which, loops, rows[which], slot[which])
        read = None if loop is None else torch.where(self.reads_cap[rows], self.exits.caps[rows], loop)
        return DepthCalls(self, site, rows, slot, loop, allowed[:, None], rope, lockstep, writes, read)


@dataclass
class InFlight:
    """Each row's token in flight: its slot [B] (the latest new token's; W − 1 before the first, while its
    prompt's ``query`` token [B] is in flight: a prefill handed it on), loop [B] (loops run), whether it is
    ``running`` [B], its states h, e [B, d] (allocated when first held; a query's e is its prompt's), for an exit
    that reads them, its last loop's log-probabilities [B, V] (allocated when an exit first reads them), and
    what its exit carries across checks."""

    slot: Tensor
    loop: Tensor
    running: Tensor
    query: Tensor
    h: Tensor | None
    e: Tensor | None
    logp: Tensor | None
    carried: Carried

    @classmethod
    def empty(cls, batch: int, width: int, device) -> InFlight:
        """No token in flight; the first new token goes into slot ``width`` (W), so each row starts one before."""
        slot = torch.full((batch,), width - 1, dtype=torch.long, device=device)
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        return cls(slot, zeros, zeros.bool(), zeros.bool(), None, None, None, Carried(batch, device))

    def hold(self, rows: Tensor, h: Tensor, e: Tensor | None = None) -> None:
        """The states h [R, d_h] (and e [R, d_e], where given) of the tokens of ``rows`` (each of the batch's
        allocated at the first)."""
        if self.h is None:
            self.h = h.new_zeros(len(self.slot), h.shape[-1])
        self.h[rows] = h
        if e is not None:
            if self.e is None:
                self.e = e.new_zeros(len(self.slot), e.shape[-1])
            self.e[rows] = e

    def logps(self, like: Tensor) -> Tensor:
        """[B, V] every row's last loop's log-probabilities (zeros where none was kept), allocated as ``like``
        [R, V] the first time an exit reads them."""
        if self.logp is None:
            self.logp = like.new_zeros(len(self.slot), like.shape[-1])
        return self.logp
