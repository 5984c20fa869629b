"""What every generation is checked for before any work, whichever decoder runs it: a model that can
decode, prompts and forced tokens of the model's vocabulary, an exit the model can run (then the decoder's
own :meth:`~looplab.generation.decoders.DecodingMethod.check`: the memory budget and what it takes)."""

from __future__ import annotations

from looplab.errors import LooplabError
from looplab.generation.decoders import DECODERS

__all__ = ["check_generation"]


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
        policies = getattr(model, "policies", None)
        if policies is not None and cache not in policies:
            raise LooplabError(
                f"the {cache} cache is not defined for {type(model.loop).__name__} (its layers read earlier tokens "
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
    if rule.needs_gate and not getattr(model, "gated", False):
        raise LooplabError(f"the {rule.name} exit reads a learned exit gate, which this model lacks (Ouro has one)")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise LooplabError("every prompt needs at least one token")
    vocab = model.head.out_features
    if any(not 0 <= token < vocab for row in (*prompts, *(forced or [])) for token in row):
        raise LooplabError(f"token ids must be in 0..{vocab - 1} (the model's vocabulary)")
    options.method.check(model, prompts, max_new_tokens, options, sources)
