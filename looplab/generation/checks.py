"""What every generation is checked for before any work, whichever decoder runs it: a model that can
decode, prompts and forced tokens of the model's vocabulary, an exit the model can run (then the decoder's
own :meth:`~looplab.generation.decoders.DecodingMethod.check`: the memory budget and what it takes); and,
after it, what the decoder returned (:func:`check_decoded`: a decoder is a plugin family, and its answer is
printed, served and scored as it is), and a plugin decoder's claim to be ``exact`` (:func:`check_exact_claim`)."""

from __future__ import annotations

import math

import torch

from looplab.errors import LooplabError
from looplab.generation.decoders import DECODERS
from looplab.generation.sampling import Generation
from looplab.generation.views import described

__all__ = ["check_generation", "check_decoded", "check_exact_claim", "EXACT_SLACK"]

#: how far (nats) below the step decoder's likeliest first token an ``exact`` decoder's greedy first token may
#: lie: float rounding between two ways of computing the prefill, not another token
EXACT_SLACK = 1e-3


def check_generation(model, prompts, max_new_tokens, options, forced=None, sources=None) -> None:
    """One-line errors for a generation ``model`` (a decoding view) cannot run with ``options``
    (a :class:`~looplab.generation.options.DecodeOptions`)."""
    cfg, rule, cache = model.cfg, options.exit_rule, options.cache
    if not cfg.causal:
        raise LooplabError(
            "generation needs a causal model (model.causal = true): this one sees the tokens it predicts"
        )
    if cfg.recurrence != "standard":
        raise LooplabError(
            f"generation caches one key and value per core layer and loop; model.recurrence = {cfg.recurrence!r} "
            "runs the core several times a loop: valid choices: standard"
        )
    if cfg.init_state == "noise" and cfg.injection != "none":
        raise LooplabError("generation does not support init_state = 'noise' (each token would need its own draw)")
    if options.policy is not None:
        policies = model.capabilities.policies
        if policies is not None and cache not in policies:
            raise LooplabError(
                f"the {cache} cache is not defined for {described(model)} (its layers read earlier tokens "
                f"through convolutions too); valid choices: {', '.join((*policies, 'none'))}"
            )
    if forced is not None:
        if not options.method.scoring:
            scorers = ", ".join(name for name, method in DECODERS.items() if method.scoring)
            raise LooplabError(
                f"the {options.decoder} decoder picks its own tokens; teacher-forced scoring takes one of: {scorers}"
            )
        if len(forced) != len(prompts) or any(len(row) == 0 for row in forced):
            raise LooplabError(f"forced tokens must be given for each of the {len(prompts)} prompts, at least one each")
    if rule.needs_head and rule.halts is None:
        raise LooplabError(f"the {rule.name} exit needs the run's halting head (a run trained with a halting schedule)")
    if rule.needs_gate and not model.capabilities.gated:
        raise LooplabError(f"the {rule.name} exit reads a learned exit gate, which this model lacks (Ouro has one)")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise LooplabError("every prompt needs at least one token")
    vocab = model.head.out_features
    if any(not 0 <= token < vocab for row in (*prompts, *(forced or [])) for token in row):
        raise LooplabError(f"token ids must be in 0..{vocab - 1} (the model's vocabulary)")
    options.method.check(model, prompts, max_new_tokens, options, sources)


def check_decoded(result, prompts, max_new_tokens: int, options, vocab: int, forced=None) -> Generation:
    """``result`` of decoder ``options.decoder`` for ``prompts``, refused in one line naming the decoder unless it
    is a :class:`Generation` with a row per prompt, at most ``max_new_tokens`` tokens a row (a forced row: its
    forced tokens), each an id of the vocabulary ``vocab``, read after a depth in 1..the exit's cap, with a
    finite log-probability ≤ 0."""
    entry = options.method

    def refuse(what: str) -> LooplabError:
        return LooplabError(f"decoder {options.decoder!r} ({entry.origin}) returned {what}")

    if not isinstance(result, Generation):
        raise refuse(f"{type(result).__name__}, not a Generation")
    fields = {"tokens": result.tokens, "depths": result.depths, "logprobs": result.logprobs}
    for name, rows in fields.items():
        if not isinstance(rows, list) or len(rows) != len(prompts):
            count = len(rows) if isinstance(rows, list) else type(rows).__name__
            raise refuse(f"{count} rows of {name} for {len(prompts)} prompts")
    cap = options.exit_rule.loops
    for row, (tokens, depths, logprobs) in enumerate(zip(result.tokens, result.depths, result.logprobs)):
        most = max_new_tokens if forced is None else len(forced[row])
        if not len(tokens) <= most:
            raise refuse(f"{len(tokens)} tokens for prompt {row}, asked for at most {most}")
        if len(depths) != len(tokens) or len(logprobs) != len(tokens):
            raise refuse(
                f"{len(tokens)} tokens, {len(depths)} depths and {len(logprobs)} log-probabilities for row {row}"
            )
        bad = next((t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise refuse(f"token {bad!r} in row {row}, outside the vocabulary 0..{vocab - 1}")
        bad = next((d for d in depths if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= cap), None)
        if bad is not None:
            raise refuse(f"depth {bad!r} in row {row}, outside 1..{cap} (the exit's cap)")
        bad = next((p for p in logprobs if not isinstance(p, float) or not math.isfinite(p) or p > 1e-9), None)
        if bad is not None:
            raise refuse(f"log-probability {bad!r} in row {row}; a log-probability is finite and ≤ 0")
    return result


def check_exact_claim(result: Generation, model, prompts, options, forced=None) -> None:
    """A plugin decoder that claims ``exact`` (greedy tokens equal the step decoder's) is held to it on each row's
    first token, as the step decoder's prefill reads it (one prefill more; looplab's own decoders are held to it
    by their tests). A first token more than :data:`EXACT_SLACK` nats below that prefill's likeliest — another
    row's answer, say — is refused in one line naming the decoder."""
    entry = options.method
    own = type(entry).__module__.startswith("looplab.generation.")
    if not entry.exact or own or forced is not None or options.sampling.temperature != 0:
        return
    from looplab.generation.options import DecodeOptions
    from looplab.generation.step import Decoder

    step = Decoder(model, prompts, 1, DecodeOptions(options.exit_rule, "per_loop"))
    logprobs = step.prefill(torch.arange(len(prompts), device=step.lengths.device))[0].double().log_softmax(-1)
    for row, tokens in enumerate(result.tokens):
        if not tokens:
            continue
        gap = float(logprobs[row].max() - logprobs[row, tokens[0]])
        if gap > EXACT_SLACK:
            raise LooplabError(
                f"decoder {options.decoder!r} ({entry.origin}) claims exact (greedy tokens equal the step "
                f"decoder's) but gave row {row} the first token {tokens[0]}, {gap:.3g} nats below the step decoder's "
                f"{int(logprobs[row].argmax())}: a decoder whose greedy tokens may differ sets exact = False"
            )
