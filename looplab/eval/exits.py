"""Test-time exits (docs/methods.md §4): when to stop looping, for any trained model, and their registry.

Each exit maps the signals of one unroll (see ``LengthOutcome``) to a depth
per sample in 1..T:

    policy        the schedule's own rule (c, T(n), or argmax π for learned halting)
    fixed         a constant K
    confidence    argmax_K of the whole-answer log-probability (Fan et al.)
    convergence   the first K with ‖h_K − h_{K−1}‖ / ‖h_K‖ < ε (T if never)
    argmax_pi     argmax_K π^(T)(K | x) of the halting head, when the model has one

The contract of an entry: a function ``(outcome, settings) -> depths``, where
``outcome`` is one length's :class:`LengthOutcome` (N samples, T loops),
``settings`` the :class:`ExitSettings` from ``[eval]``, and ``depths`` an [N]
int array in 1..T, or None when the signals it needs were not recorded.
Decorate it with ``@register_exit("name")``; the evaluation then reports its
accuracy (ID and OOD) and mean depth under ``exits.name`` in summary.json and
writes its depths to eval/samples.parquet, in registration order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from looplab.eval.grid import LengthOutcome
from looplab.model.halting import entropy, log_halting_distribution, policy_depth
from looplab.plugins import register_entry


@dataclass(frozen=True)
class ExitSettings:
    """The exits' parameters: K of ``fixed`` (already resolved, see ``fixed_exit_depth``), ε of ``convergence``."""

    fixed_depth: int = 20
    epsilon: float = 1e-3


ExitRule = Callable[[LengthOutcome, ExitSettings], "np.ndarray | None"]
EXITS: dict[str, ExitRule] = {}


def register_exit(name: str) -> Callable[[ExitRule], ExitRule]:
    """Function decorator: report the exit under ``name``."""

    def register(rule: ExitRule) -> ExitRule:
        register_entry(EXITS, name, rule, "exit")
        return rule

    return register


@register_exit("policy")
def policy_exit(outcome, settings):
    return outcome.policy_depth


@register_exit("fixed")
def fixed_exit(outcome, settings):
    return np.full(len(outcome.correct), min(settings.fixed_depth, outcome.correct.shape[1]))


@register_exit("confidence")
def confidence_exit(outcome, settings):
    return None if outcome.confidence is None else outcome.confidence.argmax(axis=1) + 1


@register_exit("convergence")
def convergence_exit(outcome, settings):
    if outcome.step_ratio is None:
        return None
    converged = outcome.step_ratio < settings.epsilon  # NaN (diverged) compares False: never converged
    return np.where(converged.any(axis=1), converged.argmax(axis=1) + 1, outcome.correct.shape[1])


@register_exit("argmax_pi")
def argmax_pi_exit(outcome, settings):
    if outcome.hazard_logits is None:
        return None
    return policy_depth(torch.from_numpy(outcome.hazard_logits)).numpy()


def exit_depths(outcome: LengthOutcome, settings: ExitSettings) -> dict[str, np.ndarray]:
    """Depths [N] (1-based) chosen by every registered exit available for this outcome."""
    found = {name: rule(outcome, settings) for name, rule in EXITS.items()}
    return {name: depths for name, depths in found.items() if depths is not None}


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
