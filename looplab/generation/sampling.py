"""What a generation returns and how each next token is picked (greedy, or sampled from a seeded generator)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from looplab.params import NON_NEGATIVE, Domain, at_least, check_domains, param


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy when ``temperature`` is 0, else sampled from
    softmax(logits / temperature) over the ``top_k`` most likely tokens (0: all), drawn from a
    generator seeded with ``seed``. Each field is checked against its domain (finite, in range)."""

    temperature: float = param(0.0, NON_NEGATIVE, "0: greedy")
    top_k: int = param(0, at_least(0), "0: every token")
    seed: int = param(0, Domain(-(2**63), 2**64 - 1), "the seed of the sampling generator (torch's range)")

    def __post_init__(self) -> None:
        check_domains(self, "sampling")


@dataclass
class Generation:
    """What :func:`generate` returns, per row: the new token ids, the loops each was read after, and
    each token's log-probability under the distribution it was read from (before any temperature)."""

    tokens: list[list[int]] = field(default_factory=list)
    depths: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    cache_bytes: int = 0

    def record(self, row: int, token: int, depth: int, logprob: float) -> None:
        """Append one new token of ``row``: its id, the loops it was read after and its log-probability."""
        self.tokens[row].append(token)
        self.depths[row].append(depth)
        self.logprobs[row].append(logprob)

    @property
    def mean_depth(self) -> float:
        """Mean loops per generated token over every row (NaN when nothing was generated)."""
        flat = [d for row in self.depths for d in row]
        return sum(flat) / len(flat) if flat else float("nan")

    @property
    def mean_loss(self) -> float:
        """Mean −log p of the tokens over every row: the loss of a :func:`score` (NaN when empty)."""
        flat = [lp for row in self.logprobs for lp in row]
        return -sum(flat) / len(flat) if flat else float("nan")


def pick(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> Tensor:
    """[R] next tokens from logits [R, V]."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # shifted so the likeliest logit is 0: a tiny temperature sharpens towards greedy instead of overflowing
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1).cpu(), 1, generator=generator).squeeze(1).to(logits.device)


def choose(logits: Tensor, rows: list[int], step: int, forced, sampling: Sampling, generator) -> Tensor:
    """[R] the next token of each live row: its forced token at ``step``, or one picked from its logits."""
    if forced is None:
        return pick(logits, sampling, generator)
    return torch.tensor([forced[row][step] for row in rows], dtype=torch.long, device=logits.device)


def ended(tokens: list[int], row: int, finished, forced) -> bool:
    """Whether a row is done after its latest token: its forced tokens used up, or ``finished`` says so."""
    if forced is not None:
        return len(tokens) == len(forced[row])
    return bool(finished and finished(tokens))
