"""The halting head's summary of one length's outcome. The test-time exits, their registry and their
parameters are :mod:`looplab.exits`; ``register_exit``, ``EXITS`` and ``exit_depths`` are importable
from here too, as plugins written for earlier releases import them.
"""

from __future__ import annotations

import torch

from looplab.eval.grid import LengthOutcome
from looplab.exits import EXITS, ExitRule, exit_depths, register_exit
from looplab.model.halting import entropy, log_halting_distribution

__all__ = ["EXITS", "ExitRule", "register_exit", "exit_depths", "halting_summary"]


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
