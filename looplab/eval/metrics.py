"""Paper-1 metrics (docs/methods.md §5), computed from per-sample outcomes.

    acc(n, K)      accuracy at depth K
    Oracle(n)      max_K acc(n, K)
    Oracle ID/OOD  mean Oracle(n) over training / OOD lengths
    Policy OOD     mean over OOD lengths of accuracy at each sample's policy depth
    Gap            Oracle OOD − Policy OOD
    Front@90       largest evaluated L with Oracle(n) ≥ 0.9 for every evaluated n ≤ L
    Flip curve     f(K) = Pr_x[ŷ_{K+1}(x) ≠ ŷ_K(x)] over OOD samples, K = 1..T−1 (the paper's)
    Flip rate      mean of f(K) over one K range, [eval.flip_from, T − 1], the same for every
                   schedule read to the same T (never a range that depends on a schedule's depth)

All values are fractions in [0, 1]; tables print percent. A metric with no samples behind
it (no OOD length, no loop pair in the range, no passing length) is None in summary.json
(NaN in tables), never 0; ``counts`` says how many lengths or pairs stand behind each.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from looplab.eval.exits import halting_summary
from looplab.eval.grid import LengthOutcome
from looplab.exits import exit_depths


def front_at(oracle_by_length: dict[int, float], train_max: int, threshold: float = 0.9) -> int | None:
    """Largest evaluated L whose every evaluated n ≤ L reaches ``threshold``; None when undefined.

    When the first OOD length fails after every evaluated training length passed, the front is
    the largest training length ``train_max`` (even if not evaluated), as in the paper. When a
    training length already fails, it is the largest passing prefix. Undefined (None): no
    evaluated length passes, or no training length was evaluated and the first OOD length fails
    (nothing then shows that the training range itself is solved).
    """
    front = None
    for n in sorted(oracle_by_length):
        if oracle_by_length[n] < threshold:
            if n > train_max and front is not None:
                return max(front, train_max)
            return front
        front = n
    return front


def flip_curve(flips: np.ndarray) -> np.ndarray:
    """f(K) = Pr[ŷ_{K+1} ≠ ŷ_K] for K = 1..T−1 over the rows of ``flips`` [N, T−1] bool; NaN where N = 0."""
    if len(flips) == 0:
        return np.full(flips.shape[1], np.nan)
    return flips.mean(axis=0)


def flip_rate(flips: np.ndarray, flip_from: int = 1) -> tuple[float, int]:
    """Mean of f(K) over K ∈ [flip_from, T − 1], and the number of (sample, K) pairs behind it.

    Every K in the range has the same N samples, so this is also the mean over all those pairs.
    (NaN, 0) when the range or the sample set is empty.

    Args:
        flips: [N, T−1] bool; column K−1 compares depth K+1 with depth K.
        flip_from: the first K of the range (1-based).
    """
    window = flips[:, max(flip_from, 1) - 1 :]
    if window.size == 0:
        return float("nan"), 0
    return float(window.mean()), int(window.size)


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _none_if_nan(value: float) -> float | None:
    return None if np.isnan(value) else value


def exit_summary(outcomes: list[LengthOutcome], train_max: int, exits: dict[str, Any] | None) -> dict:
    """Per exit: accuracy at its depths (ID and OOD means over lengths; None without such lengths)
    and its mean depth.

    An outcome read back from eval/samples.parquet carries its exits' depths; the
    others are computed by the registered exits.
    """
    chosen = [o.exit_depths if o.exit_depths is not None else exit_depths(o, exits) for o in outcomes]
    summary = {}
    for name in chosen[0]:
        per_length = {o.length: (o.accuracy_at(c[name]), float(c[name].mean())) for o, c in zip(outcomes, chosen)}
        summary[name] = {
            "policy_id": _mean([acc for n, (acc, _) in per_length.items() if n <= train_max]),
            "policy_ood": _mean([acc for n, (acc, _) in per_length.items() if n > train_max]),
            "mean_depth": float(np.mean([depth for _, depth in per_length.values()])),
        }
    return summary


def summarize(
    outcomes: list[LengthOutcome], train_max: int, exits: dict[str, Any] | None = None, flip_from: int = 1
) -> dict:
    """The summary.json content for one evaluated run.

    ``exits``: each exit's parameters (:func:`looplab.exits.exit_params`; default: their defaults).
    ``flip_from`` is the first K of the flip rate's range [flip_from, T − 1]. ``counts`` gives, per
    headline metric, the lengths (Oracle, Policy, Gap, Front@90) or (sample, K) pairs (flip rate) behind it.
    """
    loops = outcomes[0].correct.shape[1] if outcomes else 0
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
            "flip_rate": _none_if_nan(flip_rate(o.flips, flip_from)[0]),
        }
    ood = [o for o in outcomes if o.length > train_max]
    in_dist = [o for o in outcomes if o.length <= train_max]
    oracle_ood = _mean([oracle[o.length] for o in ood])
    policy_ood = _mean([o.policy_accuracy for o in ood])
    ood_flips = np.concatenate([o.flips for o in ood]) if ood else np.zeros((0, max(loops - 1, 0)), dtype=bool)
    flips, pairs = flip_rate(ood_flips, flip_from)
    return {
        "oracle_id": _mean([oracle[o.length] for o in in_dist]),
        "oracle_ood": oracle_ood,
        "policy_id": _mean([o.policy_accuracy for o in in_dist]),
        "policy_ood": policy_ood,
        "gap": None if oracle_ood is None else oracle_ood - policy_ood,
        "front90": front_at(oracle, train_max),
        "flip_rate": _none_if_nan(flips),
        "flip_range": [flip_from, loops - 1],
        "flip_curve": [_none_if_nan(float(v)) for v in flip_curve(ood_flips)],
        "counts": {
            "id_lengths": len(in_dist),
            "ood_lengths": len(ood),
            "lengths": len(outcomes),
            "flip_pairs": pairs,
        },
        "per_length": per_length,
        "exits": exit_summary(outcomes, train_max, exits),
        "halting": {str(o.length): halting_summary(o) for o in outcomes if o.hazard_logits is not None},
    }


HEADLINE = ("oracle_id", "oracle_ood", "policy_id", "policy_ood", "gap", "front90", "flip_rate")


def headline_metrics(summary: dict) -> dict[str, float]:
    """The HEADLINE numbers of a summary that are defined (an undefined one, None, is left out)."""
    return {key: float(summary[key]) for key in HEADLINE if summary.get(key) is not None}
