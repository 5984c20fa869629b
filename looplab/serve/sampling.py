"""Next-token picking for the server: looplab's :func:`~looplab.generation.sampling.pick` (greedy, or a
temperature and top-k) plus OpenAI's ``top_p`` (nucleus) filter, drawn from the same seeded generator.

With ``top_p = 1`` it *is* :func:`~looplab.generation.sampling.pick`, so a request that names no
``top_p`` draws the tokens :func:`looplab.generation.generate` draws from the same seed.

:func:`pick_rows` picks for the rows of a shared forward pass, each with its own picking and generator: a
greedy row's argmax is its own row's, and a sampled row draws from its logits alone with its request's
generator, so its draws are those of the request decoded alone (on the same logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.generation.sampling import Sampling, pick

__all__ = ["Picking", "pick_next", "pick_rows"]


@dataclass(frozen=True)
class Picking:
    """A request's :class:`~looplab.generation.Sampling` and its nucleus mass ``top_p`` in (0, 1]."""

    sampling: Sampling
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.sampling.temperature == 0


def pick_next(logits: Tensor, picking: Picking, generator: torch.Generator) -> Tensor:
    """[R] next tokens from logits [R, V]: the likeliest tokens whose probabilities sum to ``top_p``
    (at least one) are kept, after the temperature and top-k, and one is drawn."""
    sampling = picking.sampling
    if picking.top_p >= 1 or sampling.temperature == 0:
        return pick(logits, sampling, generator)
    scaled = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / sampling.temperature
    if 0 < sampling.top_k < scaled.shape[-1]:
        kth = scaled.topk(sampling.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs, order = scaled.softmax(dim=-1).sort(dim=-1, descending=True)
    # a token is kept when the mass of the tokens likelier than it is below top_p: the first always is
    drop = probs.cumsum(dim=-1) - probs >= picking.top_p
    probs = probs.masked_fill(drop, 0.0)
    drawn = torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)
    return order.gather(1, drawn).squeeze(1)


def pick_rows(logits: Tensor, pickings: list[Picking], generators: list[torch.Generator | None]) -> Tensor:
    """[R] next tokens from logits [R, V], row ``i`` picked by ``pickings[i]`` and drawn from ``generators[i]``
    (None for a greedy row)."""
    chosen = logits.argmax(dim=-1)
    for i, (picking, generator) in enumerate(zip(pickings, generators, strict=True)):
        if not picking.greedy:
            chosen[i] = pick_next(logits[i : i + 1], picking, generator)[0]
    return chosen
