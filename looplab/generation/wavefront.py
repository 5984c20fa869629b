"""Wavefront decoding: many positions of a row in flight at once, each frozen when its exit stops it.

Our exact form of Huginn's diffusion-forcing sampler (arXiv 2510.14961). Each core call advances every
position in flight of every row by one loop. A row's position g runs its loops from the token in it;
after each loop its next-token guess (the greedy token of its state so far) is the token of position
g + 1, which starts at once, a loop behind it, so up to ``front`` positions of a row run together,
each at its own loop. A position stops where its exit says (the cap, convergence, kl: the exit of
the other decoders), and is frozen once the position before it is: its next token is then final and
committed. Where a position's guess changes, the positions after it are dropped and the one after it
starts again from the new guess.

Why it is exact. Under ``per_loop`` a position's loop-t state reads the loop-t keys and values of the
positions before it, and those depend on their own tokens only. A position before it in flight is
always at least a loop ahead (it started earlier and stops no sooner than it must), so those keys
exist; one that stopped at k lends loop k to the later loops (written through, as depth-wise batching
writes). A position whose token was a wrong guess is dropped with every position after it, and each
runs again from loop 1. So every committed token is the one greedy decoding under the same exit
picks (tested in float64 against the step decoder), and what the wavefront buys is fewer sequential
calls: a row commits up to one token per call once its guesses hold, instead of one per its token's
depth. Huginn's sampler instead keeps refining a position whose input changed (its injection reads
the new token every loop) and accepts the drift (about 1 % accuracy there); a looplab model without
injection reads its token only at loop 0, so here a changed input starts the position again.

What it takes: greedy picking, the ``per_loop`` cache, a looplab model or retrofit without coda layers
(a coda would read earlier positions' final states before they are final).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.generation.decoders import DecodingMethod, register_decoder
from looplab.generation.depthwise import DepthwiseDecoder, check_depthwise
from looplab.generation.passes import core_pass, logits_of, prelude_pass
from looplab.generation.sampling import Generation, ended
from looplab.params import at_least, param
from looplab.token_exits import Carried

__all__ = ["WavefrontDecoder", "Wavefront", "check_wavefront"]


def check_wavefront(model) -> None:
    """One-line errors for a model (a decoding view) wavefront decoding cannot run."""
    check_depthwise(model, "wavefront decoding")
    if len(model.coda):
        raise LooplabError(
            "wavefront decoding reads each position's logits before the positions ahead of it are final; "
            f"a coda ({len(model.coda)} layers) would read their unfinished states: valid models have no coda"
        )


@dataclass
class WavefrontParams:
    front: int = param(0, at_least(0), "positions of a row in flight at once (0: the exit's cap)")


@register_decoder
class Wavefront(DecodingMethod):
    """Many positions of a row in flight, each at its own loop (module docstring)."""

    name = "wavefront"
    Params = WavefrontParams
    caches = ("per_loop",)
    sampling = False
    scoring = False

    def check(self, model, prompts, max_new_tokens, options, sources) -> None:
        check_wavefront(model)
        super().check(model, prompts, max_new_tokens, options, sources)

    def decode(self, model, prompts, max_new_tokens, options, finished, forced) -> Generation:
        front = options.decoder_params.front or options.exit_rule.loops
        return WavefrontDecoder(model, prompts, max_new_tokens, options, finished, front).run()


class WavefrontDecoder(DepthwiseDecoder):
    """The depth-wise decoder's prefill, caches and calls, with up to ``front`` positions per row (module
    docstring). Per slot of each row: its token, loops run, whether it is in flight and still running, its
    states h, e, its latest next-token guess and, for an exit that reads them, its log-probabilities."""

    #: its prefill runs each query token to its exit (its own calls keep positions, not one token a row)
    HANDS_ON = False

    def __init__(self, model, prompts, max_new_tokens, options, finished, front: int):
        super().__init__(model, prompts, max_new_tokens, options, finished)
        self.front = front
        batch, slots = self.slots.positions.shape
        device = self.lengths.device
        self.token = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.loop = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.running = torch.zeros(batch, slots, dtype=torch.bool, device=device)
        self.guess = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.h = self.e = self.logp = None
        self.carried = Carried(batch * slots, device)  # what each position's exit carries, at row · slots + slot
        self.entering: list[tuple[int, int]] = []  # (row, slot) entered since the last prelude
        self.inflight: list[list[int]] = [[] for _ in range(batch)]  # per row, the slots in flight, in order
        self.calls = 0  # core calls of the decode (the prefill's not counted)

    def run(self) -> Generation:
        batch, device = len(self.lengths), self.lengths.device
        every = torch.arange(batch, device=device)
        logits, depths = self.prefill(every)
        out = Generation(*([[] for _ in range(batch)] for _ in range(3)))
        logprobs = logits.double().log_softmax(-1)
        first = logits.argmax(-1)
        for row in range(batch):
            if self._commit(out, row, int(first[row]), float(logprobs[row, first[row]]), int(depths[row])):
                self._enter(row, self.width, int(first[row]))
        self._flush()
        while any(self.running.any(1).tolist()):
            self._advance()
            for row in range(batch):
                if self.inflight[row]:
                    self._settle(out, row)
            self._flush()
        out.cache_bytes = self.cache.nbytes()
        return out

    def _commit(self, out: Generation, row: int, token: int, logprob: float, depth: int) -> bool:
        """Append a final token to ``row``'s output; whether the row goes on."""
        out.record(row, token, depth, logprob)
        return len(out.tokens[row]) < self.max_new and not ended(out.tokens[row], row, self.finished, self.forced)

    def _enter(self, row: int, slot: int, token: int) -> None:
        """Queue ``token`` into ``slot`` of ``row`` (run from loop 0 at the next :meth:`_flush`)."""
        self.inflight[row].append(slot)
        self.token[row, slot] = token
        self.loop[row, slot] = 0
        self.running[row, slot] = True
        if self.exit.carries:
            self.carried.restart(torch.tensor([row * self.token.shape[1] + slot], device=self.token.device))
        self.start(row, slot, self.lengths[row] + slot - self.width)
        self.entering.append((row, slot))

    def _drop(self, row: int, index: int) -> None:
        """Drop ``row``'s positions in flight from ``index`` on (nothing reads their slots until they run again)."""
        for slot in self.inflight[row][index:]:
            self.running[row, slot] = False
            self.slots.real[row, slot] = False
        self.entering = [(r, s) for r, s in self.entering if r != row or s not in self.inflight[row][index:]]
        del self.inflight[row][index:]

    def _flush(self) -> None:
        """Run the prelude of every position queued by :meth:`_enter`: each is then at loop 0 of its token."""
        if not self.entering:
            return
        rows = torch.tensor([r for r, _ in self.entering], device=self.lengths.device)
        slots = torch.tensor([s for _, s in self.entering], device=self.lengths.device)
        self.entering = []
        x = self.model.embedding(self.token[rows, slots][:, None])
        if self.model.positions is not None:
            x = x + self.model.positions.weight[self.slots.positions[rows, slots]][:, None]
        e = (
            x[:, 0]
            if not len(self.model.prelude)
            else prelude_pass(self.model, x, self._calls("prelude", rows, slots))[:, 0]
        )
        h = self.model.initial_state(e)
        if self.h is None:
            shape = self.token.shape
            self.h, self.e = h.new_zeros(*shape, h.shape[-1]), e.new_zeros(*shape, e.shape[-1])
        self.h[rows, slots], self.e[rows, slots] = h, e

    def _advance(self) -> None:
        """One core call: every running position one loop on; their exits, states and guesses."""
        rows, slots = self.running.nonzero(as_tuple=True)
        loop = self.loop[rows, slots] + 1
        if self.prompt is not None:  # a lazy prompt runs a loop when a later token of its row first needs it
            behind = loop > self.prompt.depth[rows]
            for t in loop[behind].unique().tolist():
                self.deepen_prompt(rows[behind & (loop == t)].unique(), t)
        h_prev = self.h[rows, slots]
        calls = self._calls("core", rows, slots, loop)
        h = core_pass(self.model, h_prev[:, None], self.e[rows, slots][:, None], calls)[:, 0]
        self.calls += 1
        logits = logits_of(self.model, h)
        logp = logits.log_softmax(-1) if self.exit.reads_logits else None
        if logp is not None and self.logp is None:
            self.logp = logp.new_zeros(*self.token.shape, logp.shape[-1])
        places = rows * self.token.shape[1] + slots
        earlier = None if logp is None else self.logp[rows, slots]
        carried = self.carried.of(self.exit, places)
        stop, carried = self.exit.check_rows(loop, h, h_prev, logp, earlier, carried)
        self.carried.put(self.exit, places, carried)
        self.h[rows, slots], self.loop[rows, slots] = h, loop
        if logp is not None:
            self.logp[rows, slots] = logp
        self.guess[rows, slots] = logits.argmax(-1)
        self.running[rows[stop], slots[stop]] = False
        self.last_logits = {(r, s): i for i, (r, s) in enumerate(zip(rows.tolist(), slots.tolist()))}
        self.logits = logits

    def _settle(self, out: Generation, row: int) -> None:
        """After a call: freeze ``row``'s stopped positions in order (committing their next tokens), start again
        after any guess that changed, and start the next position behind the last."""
        inflight = self.inflight[row]
        while inflight and not bool(self.running[row, inflight[0]]):  # the first position's token is final
            slot = inflight.pop(0)
            token = int(self.guess[row, slot])
            logprob = float(self._logits_of(row, slot).double().log_softmax(-1)[token])
            if not self._commit(out, row, token, logprob, int(self.loop[row, slot])):
                self._drop(row, 0)
                return
            if not inflight or int(self.token[row, inflight[0]]) != token:
                self._drop(row, 0)
                self._enter(row, slot + 1, token)
                return
        for index in range(len(inflight) - 1):  # a guess that changed drops the positions after it
            slot = inflight[index]
            if int(self.token[row, inflight[index + 1]]) != int(self.guess[row, slot]):
                self._drop(row, index + 1)
                self._enter(row, slot + 1, int(self.guess[row, slot]))
                return
        tail = inflight[-1]
        # position g (slot W + g) reads token g + 1, so the last one needed is g = max_new − 2
        room = tail + 1 - self.width <= self.max_new - 2 and len(inflight) < self.front
        if room and int(self.loop[row, tail]) >= 1:
            self._enter(row, tail + 1, int(self.guess[row, tail]))

    def _logits_of(self, row: int, slot: int) -> Tensor:
        """The next-token logits [V] of the position in ``slot`` of ``row`` at its last loop (it stopped in the
        latest call, or earlier: then its state is recomputed into logits)."""
        index = self.last_logits.get((row, slot))
        if index is not None:
            return self.logits[index]
        return logits_of(self.model, self.h[row, slot])
