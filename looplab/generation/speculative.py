"""Self-speculative decoding: the draft is the same model at fewer loops.

A looped model at k < K loops is a cheaper model of itself at K. Each round, every live row drafts
``n`` tokens greedily at k loops, one at a time, through the ``per_loop`` cache; then one batched
pass continues the n drafted positions from loop k + 1 to K (their loops 1..k are already the
K-loop model's: under ``per_loop`` a token's loop-t state reads only loop-t keys of tokens before
it, which the draft computed exactly as a K-loop run does) and reads the K-loop next-token
distribution at each. The row keeps the longest drafted prefix that K-loop greedy decoding agrees
with, plus K's own token at the first disagreement, so the tokens are those of fixed-K greedy
decoding (tested in float64), and a round costs n·k sequential loops and one batched pass of
n·(K − k) loops instead of n·K sequential loops.

Bookkeeping. The decoder's invariant is: every committed token but the row's last is in the cache
at all K loops. A round writes its n tokens (the last committed one, then n − 1 drafts) into the
next n slots of every live row; the slots of rejected drafts are marked not real, so no later
token attends to them (slots are per row and hold positions, so rows that kept different counts
still share one slice of slots per round). Slots are allocated for the worst case, n per new token.

What it takes: a fixed exit at K loops, greedy picking, the ``per_loop`` cache, and a model whose
layers read earlier tokens through attention only (Inkling-2's convolutions over time read the
slot before, which a rejected draft may hold).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.generation.cache import visible
from looplab.generation.decoders import DecodingMethod, register_decoder
from looplab.generation.passes import Calls, coda_pass, core_pass, logits_of, prelude_pass
from looplab.generation.sampling import Generation, ended
from looplab.generation.step import Decoder
from looplab.generation.views import described
from looplab.params import Domain, at_least, param

#: the most tokens one round may draft (a round's drafts take cache slots whether kept or not)
MAX_DRAFT = 64

__all__ = ["SpeculativeGeneration", "Speculative", "SpeculativeDecoder"]


@dataclass
class SpeculativeGeneration(Generation):
    """A :class:`Generation` and its drafts: ``drafted`` draft tokens proposed, ``accepted`` of them kept."""

    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        """Accepted drafts / proposed drafts (NaN when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else float("nan")


@dataclass
class SpeculativeParams:
    draft_loops: int = param(1, at_least(1), "the draft's depth k, below the exit's loops")
    draft_tokens: int = param(4, Domain(1, MAX_DRAFT), "tokens drafted per round")


@register_decoder
class Speculative(DecodingMethod):
    """Greedy decoding at the fixed exit's loops K, drafted ``draft_tokens`` at a time at ``draft_loops`` loops
    (module docstring). Its :class:`SpeculativeGeneration` counts the drafts proposed and kept."""

    name = "speculative"
    Params = SpeculativeParams
    adaptive_exits = False
    caches = ("per_loop",)
    sampling = False
    scoring = False

    def check(self, model, prompts, max_new_tokens, options, sources) -> None:
        loops, params = options.exit_rule.loops, options.decoder_params
        if not params.draft_loops < loops:
            raise LooplabError(
                f"draft_loops must be in 1..{loops - 1} (below the exit's {loops} loops), got {params.draft_loops}"
            )
        if model.capabilities.policies is not None:
            raise LooplabError(
                f"speculative decoding is not defined for {described(model)}: its layers read the slot before "
                "through convolutions over time, which a rejected draft may hold"
            )
        super().check(model, prompts, max_new_tokens, options, sources)
        _check_draft_slots(model, prompts, max_new_tokens, loops, params.draft_tokens)

    def decode(self, model, prompts, max_new_tokens, options, finished, forced) -> SpeculativeGeneration:
        params = options.decoder_params
        return SpeculativeDecoder(
            model, prompts, max_new_tokens, options, params.draft_loops, params.draft_tokens, finished
        ).run()


def _check_draft_slots(view, prompts, max_new_tokens: int, loops: int, draft_tokens: int) -> None:
    """Refuse, before allocating, the cache slots a speculative generation holds: a round's n drafts take n
    slots whatever is kept, so the cache holds the prompts and max_new_tokens × n slots."""
    from looplab.generation.budget import generation_bytes
    from looplab.memory import GIB, device_bytes

    device = str(view.head.weight.device)
    width = max(map(len, prompts))
    needed = generation_bytes(view, len(prompts), width, max_new_tokens * draft_tokens, loops, "per_loop")
    available = device_bytes(device)
    if needed > available:
        raise LooplabError(
            f"speculative decoding of {max_new_tokens} tokens in drafts of {draft_tokens} holds "
            f"{max_new_tokens * draft_tokens} cache slots per row, an estimated {needed / GIB:,.1f} GiB, more than "
            f"the {available / GIB:,.1f} GiB of {device}: use fewer --draft-tokens or --max-new-tokens"
        )


class SpeculativeDecoder(Decoder):
    """The cached decoder's prefill and passes, stepped in draft-and-verify rounds (module docstring)."""

    def __init__(self, model, prompts, max_new_tokens, options, draft_loops, draft_tokens, finished=None):
        super().__init__(model, prompts, max_new_tokens * draft_tokens, options, finished)
        self.max_new, self.draft_loops, self.draft_tokens = max_new_tokens, draft_loops, draft_tokens

    def run(self) -> SpeculativeGeneration:
        batch = len(self.lengths)
        out = SpeculativeGeneration(*([[] for _ in range(batch)] for _ in range(3)))
        live = self.begin(out)
        while live:
            live = self.round(out, live)
        out.cache_bytes = self.cache.nbytes()
        return out

    def begin(self, out: SpeculativeGeneration) -> list[int]:
        """Prefill every row and commit its first token (K's greedy pick) to ``out``; the rows that go on."""
        rows = torch.arange(len(self.lengths), device=self.lengths.device)
        logits, _ = self.prefill(rows)
        first = logits.argmax(-1)
        logprobs = logits.double().log_softmax(-1)
        live = []
        for row in rows.tolist():
            self._commit(out, row, int(first[row]), float(logprobs[row, first[row]]))
            if not self._done(out, row):
                live.append(row)
        self.base = self.width  # the next round's first slot
        return live

    def round(self, out: SpeculativeGeneration, live: list[int]) -> list[int]:
        """One draft-and-verify round of the ``live`` rows, each one's kept tokens committed to ``out``; the rows
        that go on."""
        base, n, device = self.base, self.draft_tokens, self.lengths.device
        live_rows = torch.tensor(live, device=device)
        last = torch.tensor([out.tokens[row][-1] for row in live], device=device)
        start = self.lengths[live_rows] + torch.tensor([len(out.tokens[row]) - 1 for row in live], device=device)
        chunk = slice(base, base + n)
        # a draft past a row's last new token is never kept; its position is held within the model's
        # (the budget keeps every kept token's there), so a learned position table is never overrun
        drafted = start[:, None] + torch.arange(n, device=device)
        self.slots.positions[live_rows, chunk] = drafted.clamp(max=self.model.cfg.max_len - 1)
        drafts, h, e = self._draft(last, live_rows, base, n)
        logits = self._verify(h, e, live_rows, chunk)  # [R, n, V] at K loops
        agreed = logits.argmax(-1)  # [R, n]: K's token after each of the round's inputs
        logprobs = logits.double().log_softmax(-1)
        still = []
        for i, row in enumerate(live):
            kept = 0  # drafts d_1..d_kept agree with K
            while kept < n and int(drafts[i, kept]) == int(agreed[i, kept]):
                kept += 1
            out.drafted += n
            out.accepted += kept
            for j in range(min(kept + 1, n)):
                self._commit(out, row, int(agreed[i, j]), float(logprobs[i, j, agreed[i, j]]))
                if self._done(out, row):
                    break
            # the round's slots beyond the row's last committed token but one hold rejected drafts
            self.slots.real[row, base + min(kept + 1, n) : base + n] = False
            if not self._done(out, row):
                still.append(row)
        self.base = base + n
        return still

    def _commit(self, out: SpeculativeGeneration, row: int, token: int, logprob: float) -> None:
        out.record(row, token, self.exit.loops, logprob)

    def _done(self, out: SpeculativeGeneration, row: int) -> bool:
        return len(out.tokens[row]) >= self.max_new or ended(out.tokens[row], row, self.finished, None)

    def _draft(self, last: Tensor, rows: Tensor, base: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """Feed each row's last committed token, then its drafts, one slot at a time at k loops.

        Returns the drafts d_1..d_n [R, n] and the round's n inputs' states h, e [R, n, d] after loop k.
        """
        token, drafts, states, injected = last, [], [], []
        for i in range(n):
            slot = slice(base + i, base + i + 1)
            self.slots.real[rows, slot] = True
            one_pass = self._pass(rows, slot)
            h, e = self._loops(token[:, None], None, None, one_pass, slot, 1, self.draft_loops)
            token = self._read(h, one_pass, slot)[:, 0].argmax(-1)
            drafts.append(token)
            states.append(h)
            injected.append(e)
        return torch.stack(drafts, 1), torch.cat(states, 1), torch.cat(injected, 1)

    def _verify(self, h: Tensor, e: Tensor, rows: Tensor, chunk: slice) -> Tensor:
        """Loops k + 1..K of the round's inputs in one pass, then the K-loop logits [R, n, V] at each."""
        one_pass = self._pass(rows, chunk)
        h, _ = self._loops(None, h, e, one_pass, chunk, self.draft_loops + 1, self.exit.loops)
        return self._read(h, one_pass, chunk)

    def _loops(self, tokens, h, e, one_pass, chunk: slice, first: int, last: int) -> tuple[Tensor, Tensor]:
        """Core loops ``first``..``last`` of the tokens in ``chunk`` of one pass's rows (:meth:`_pass`): from their
        ids [R, m] when ``first`` is 1 (the prelude first), else from their states h, e [R, m, d] after loop
        first − 1."""
        key, allowed, rope, positions = one_pass
        if first == 1:
            x = self.model.embedding(tokens)
            if self.model.positions is not None:
                x = x + self.model.positions.weight[positions]
            e = prelude_pass(self.model, x, Calls(self, "prelude", 0, key, chunk, allowed, rope))
            h = self.model.initial_state(e)
        for t in range(first, last + 1):
            h = core_pass(self.model, h, e, Calls(self, "core", t, key, chunk, allowed, rope))
        return h, e

    def _read(self, h: Tensor, one_pass, chunk: slice) -> Tensor:
        """Next-token logits [R, m, V] of states h [R, m, d] after the coda."""
        key, allowed, rope, _ = one_pass
        return logits_of(self.model, coda_pass(self.model, h, Calls(self, "coda", 0, key, chunk, allowed, rope)))

    def _pass(self, rows: Tensor, chunk: slice):
        """The cache key (a slice when every row runs), attention mask, RoPE tables and positions [R, m] of the
        pass of ``rows``' tokens in ``chunk``."""
        key = slice(None) if len(rows) == len(self.lengths) else rows
        positions = self.slots.positions[rows, chunk]
        rope = None if self.rope is None else (self.rope[0][positions], self.rope[1][positions])
        return key, visible(self.slots, key, chunk, self.model.cfg.attention_window), rope, positions
