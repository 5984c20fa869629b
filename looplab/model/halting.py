"""Halting distributions over loop depth (docs/methods.md §4).

A hazard head reads the mask-aware mean-pooled state h_t and gives
r_t = σ(z_t), the probability of stopping at t given that we got there:

    π(τ = t)     = r_t ∏_{i<t} (1 − r_i)      1 ≤ t < T_max
    π(τ = T_max) = ∏_{i<T_max} (1 − r_i)       (the remaining mass)

Everything is computed in log space from the hazard logits z, so that long
unrolls with small hazards neither underflow nor lose the remainder mass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def masked_mean_pool(h: Tensor, valid: Tensor) -> Tensor:
    """Mean over the non-pad positions: h [B, L, d], valid [B, L] → [B, d]."""
    weights = valid.to(h.dtype).unsqueeze(-1)
    return (h * weights).sum(1) / weights.sum(1).clamp_min(1)


def pooled_answer(h: Tensor, valid: Tensor, width: int) -> Tensor:
    """What a halting head reads: the mean-pooled answer part of the state, h [B, L, D] → [B, width].

    The answer part is the first ``width`` = d features: all of h, or y of TRM's state [y ; z]
    (``LoopedTransformer.answer_state``), which TRM's own halting head reads.
    """
    return masked_mean_pool(h[..., :width], valid)


class HazardHead(nn.Module):
    """q_φ: Linear(d, 1) on the pooled state, returning hazard logits z_t."""

    def __init__(self, d_model: int):
        super().__init__()
        self.linear = nn.Linear(d_model, 1)
        nn.init.normal_(self.linear.weight, std=0.02)
        # Start with a small hazard (σ(-2) ≈ 0.12) so early training explores deeper loops too.
        nn.init.constant_(self.linear.bias, -2.0)

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """h [B, L, d] (TRM: [B, L, 2d]), valid [B, L] → hazard logits [B]."""
        return self.linear(pooled_answer(h, valid, self.linear.in_features)).squeeze(-1)


def log_halting_distribution(hazard_logits: Tensor) -> Tensor:
    """log π over depths 1..T from hazard logits [B, T] (the last logit is unused).

    Returns:
        [B, T] log-probabilities; the last column holds the remainder mass.
    """
    log_stop = F.logsigmoid(hazard_logits)
    log_go_on = F.logsigmoid(-hazard_logits)
    survived = torch.cumsum(log_go_on, dim=1) - log_go_on  # Σ_{i<t} log(1 − r_i)
    log_pi = survived + log_stop
    return torch.cat([log_pi[:, :-1], survived[:, -1:]], dim=1)


def policy_depth(hazard_logits: Tensor) -> Tensor:
    """argmax_t π(t) over 1..T for hazard logits [B, T] → [B] long, 1-based."""
    return log_halting_distribution(hazard_logits).argmax(dim=1) + 1


def entropy(log_pi: Tensor) -> Tensor:
    """H(π) per row for log π [B, T] → [B]."""
    return -(log_pi.exp() * log_pi).sum(dim=1)


def log_geometric_prior(rate: float, steps: int, device=None) -> Tensor:
    """log of Geometric(rate) truncated to 1..T with the remainder at T → [T]."""
    logit = math.log(rate) - math.log1p(-rate)
    return log_halting_distribution(torch.full((1, steps), logit, device=device))[0]
