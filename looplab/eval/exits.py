"""Test-time exits (docs/methods.md §4): when to stop looping, for any trained model.

Each exit maps the signals of one unroll (see ``LengthOutcome``) to a depth
per sample in 1..T:

    policy        the schedule's own rule (c, T(n), or argmax π for learned halting)
    fixed         a constant K
    confidence    argmax_K of the whole-answer log-probability (Fan et al.)
    convergence   the first K with ‖h_K − h_{K−1}‖ / ‖h_K‖ < ε (T if never)
    argmax_pi     argmax_K π^(T)(K | x) of the halting head, when the model has one
"""

from __future__ import annotations

import numpy as np
import torch

from looplab.eval.grid import LengthOutcome
from looplab.model.halting import entropy, log_halting_distribution, policy_depth


def exit_depths(outcome: LengthOutcome, fixed_depth: int, epsilon: float) -> dict[str, np.ndarray]:
    """Depths [N] (1-based) chosen by every exit available for this outcome."""
    steps = outcome.correct.shape[1]
    count = len(outcome.correct)
    depths = {
        "policy": outcome.policy_depth,
        "fixed": np.full(count, min(fixed_depth, steps)),
    }
    if outcome.confidence is not None:
        depths["confidence"] = outcome.confidence.argmax(axis=1) + 1
    if outcome.step_ratio is not None:
        converged = outcome.step_ratio < epsilon  # NaN (diverged) compares False: never converged
        depths["convergence"] = np.where(converged.any(axis=1), converged.argmax(axis=1) + 1, steps)
    if outcome.hazard_logits is not None:
        depths["argmax_pi"] = policy_depth(torch.from_numpy(outcome.hazard_logits)).numpy()
    return depths


def halting_summary(outcome: LengthOutcome) -> dict | None:
    """Mean depth, entropy and mean histogram of π^(T) at this length (None without a head)."""
    if outcome.hazard_logits is None:
        return None
    log_pi = log_halting_distribution(torch.from_numpy(outcome.hazard_logits).double())
    pi = log_pi.exp()
    depths = torch.arange(1, pi.shape[1] + 1, dtype=pi.dtype)
    return {
        "mean_depth": float((pi * depths).sum(1).mean()),
        "entropy": float(entropy(log_pi).mean()),
        "histogram": pi.mean(0).tolist(),
    }
