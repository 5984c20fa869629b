"""Paper-1 metrics (docs/methods.md §5), computed from per-sample outcomes.

    acc(n, K)      accuracy at depth K
    Oracle(n)      max_K acc(n, K)
    Oracle ID/OOD  mean Oracle(n) over training / OOD lengths
    Policy OOD     mean over OOD lengths of accuracy at each sample's policy depth
    Gap            Oracle OOD − Policy OOD
    Front@90       largest evaluated L with Oracle(n) ≥ 0.9 for every evaluated n ≤ L
    Flip rate      Pr[ŷ_{K+1} ≠ ŷ_K]; summary = mean over K ≥ policy depth

All values are fractions in [0, 1]; tables print percent.
"""

from __future__ import annotations

import numpy as np

from looplab.eval.exits import ExitSettings, exit_depths, halting_summary
from looplab.eval.grid import LengthOutcome


def front_at(oracle_by_length: dict[int, float], train_max: int, threshold: float = 0.9) -> int:
    """Largest evaluated L whose every evaluated n ≤ L reaches ``threshold``.

    When the first OOD length fails, the front is the largest training length
    ``train_max`` (even if not evaluated). When a training length already
    fails, it is the largest passing prefix (0 if none).
    """
    front = 0
    for n in sorted(oracle_by_length):
        if oracle_by_length[n] < threshold:
            return max(front, train_max) if n > train_max else front
        front = n
    return front


def flip_rate_after_policy(flips: np.ndarray, policy_depth: np.ndarray) -> float:
    """Mean over samples of the flip rate at K ≥ the sample's policy depth.

    Args:
        flips: [N, T-1] bool; column K-1 compares depth K+1 with depth K.
        policy_depth: [N] int in 1..T.
    """
    if flips.shape[1] == 0:
        return 0.0
    k = np.arange(1, flips.shape[1] + 1)[None, :]
    after = k >= policy_depth[:, None]
    counts = after.sum(axis=1)
    rows = counts > 0
    if not rows.any():
        return 0.0
    return float(((flips & after).sum(axis=1)[rows] / counts[rows]).mean())


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def exit_summary(outcomes: list[LengthOutcome], train_max: int, settings: ExitSettings) -> dict:
    """Per exit: accuracy at its depths (ID and OOD means over lengths) and its mean depth.

    An outcome read back from eval/samples.parquet carries its exits' depths; the
    others are computed by the registered exits.
    """
    chosen = [o.exit_depths if o.exit_depths is not None else exit_depths(o, settings) for o in outcomes]
    summary = {}
    for name in chosen[0]:
        per_length = {o.length: (o.accuracy_at(c[name]), float(c[name].mean())) for o, c in zip(outcomes, chosen)}
        summary[name] = {
            "policy_id": _mean([acc for n, (acc, _) in per_length.items() if n <= train_max]),
            "policy_ood": _mean([acc for n, (acc, _) in per_length.items() if n > train_max]),
            "mean_depth": float(np.mean([depth for _, depth in per_length.values()])),
        }
    return summary


def summarize(outcomes: list[LengthOutcome], train_max: int, settings: ExitSettings | None = None) -> dict:
    """The summary.json content for one evaluated run; ``settings`` configure the exits (default ExitSettings())."""
    settings = settings or ExitSettings()
    per_length, oracle = {}, {}
    for o in outcomes:
        acc = o.accuracy
        oracle[o.length] = float(acc.max())
        per_length[str(o.length)] = {
            "split": "id" if o.length <= train_max else "ood",
            "oracle": oracle[o.length],
            "best_k": int(acc.argmax()) + 1,
            "policy": o.policy_accuracy,
            "policy_depth": float(o.policy_depth.mean()),
            "flip_rate": flip_rate_after_policy(o.flips, o.policy_depth),
        }
    ood = [o for o in outcomes if o.length > train_max]
    in_dist = [o for o in outcomes if o.length <= train_max]
    focus = ood or outcomes
    oracle_ood = _mean([oracle[o.length] for o in ood])
    policy_ood = _mean([o.policy_accuracy for o in ood])
    all_flips = np.concatenate([o.flips for o in focus])
    return {
        "oracle_id": _mean([oracle[o.length] for o in in_dist]),
        "oracle_ood": oracle_ood,
        "policy_id": _mean([o.policy_accuracy for o in in_dist]),
        "policy_ood": policy_ood,
        "gap": None if oracle_ood is None else oracle_ood - policy_ood,
        "front90": front_at(oracle, train_max),
        "flip_rate": flip_rate_after_policy(all_flips, np.concatenate([o.policy_depth for o in focus])),
        "flip_curve": all_flips.mean(axis=0).tolist() if all_flips.size else [],
        "per_length": per_length,
        "exits": exit_summary(outcomes, train_max, settings),
        "halting": {str(o.length): halting_summary(o) for o in outcomes if o.hazard_logits is not None},
    }


HEADLINE = ("oracle_id", "oracle_ood", "policy_id", "policy_ood", "gap", "front90", "flip_rate")


def headline_metrics(summary: dict) -> dict[str, float]:
    """The HEADLINE numbers of a summary that it has (Oracle OOD of a run without OOD lengths is None)."""
    return {key: float(summary[key]) for key in HEADLINE if summary.get(key) is not None}
