"""The ``recompute`` decoder: no KV cache; every step runs each row's whole sequence at the fixed depth.
What every cached decoder computes, the slow way: the reference the cached ones are tested against
(``--cache none``)."""

from __future__ import annotations

import torch

from looplab.generation.decoders import DecodingMethod, register_decoder
from looplab.generation.policies import NO_CACHE
from looplab.generation.sampling import Generation, choose, ended
from looplab.tasks.base import PAD

__all__ = ["Recompute"]


@register_decoder
class Recompute(DecodingMethod):
    name = "recompute"
    adaptive_exits = False
    caches = (NO_CACHE,)

    def decode(self, model, prompts, max_new_tokens, options, finished, forced) -> Generation:
        return recompute(model, prompts, max_new_tokens, options.exit_rule.loops, options.sampling, finished, forced)


def recompute(model, prompts, max_new_tokens, loops, sampling, finished, forced) -> Generation:
    """Recompute every row's whole sequence at ``loops`` loops for every new token (the reference)."""
    device = model.head.weight.device
    generator = torch.Generator().manual_seed(sampling.seed)
    sequences = [list(p) for p in prompts]
    out = Generation(*([[] for _ in prompts] for _ in range(3)))
    live = list(range(len(prompts)))
    for step in range(max_new_tokens):
        lengths = torch.tensor([len(sequences[r]) for r in live], device=device)
        tokens = torch.full((len(live), int(lengths.max())), PAD, dtype=torch.long, device=device)
        for i, row in enumerate(live):
            tokens[i, : len(sequences[row])] = torch.tensor(sequences[row], device=device)
        valid = torch.arange(tokens.shape[1], device=device)[None, :] < lengths[:, None]
        logits = model(tokens, valid, loops)[torch.arange(len(live), device=device), lengths - 1]
        chosen = choose(logits, live, step, forced, sampling, generator)
        logprobs = logits.double().log_softmax(-1).gather(1, chosen[:, None]).squeeze(1).tolist()
        still = []
        for i, row in enumerate(live):
            token = int(chosen[i])
            sequences[row].append(token)
            out.record(row, token, loops, logprobs[i])
            if not ended(out.tokens[row], row, finished, forced):
                still.append(row)
        live = still
        if not live:
            break
    return out
