"""The stopping study's effect test: does a schedule cut the seed-to-seed spread and the Gap of ``fixed``?

Stated before any run: the effect is reproduced for a task when the 95% bootstrap interval of
std(fixed) / std(other) of Oracle OOD lies above 1 and that of Gap(fixed) − Gap(other) lies above 0,
each variant's seeds resampled apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from looplab.report.aggregate import BOOTSTRAP_SEED, RESAMPLES, numeric
from looplab.report.comparison import variant_stem

EFFECT_RULE = (
    "the effect is reproduced for a task when the 95% bootstrap interval of std(fixed) / std(other) of Oracle "
    "OOD lies above 1 and that of Gap(fixed) − Gap(other) lies above 0 (each variant's seeds resampled apart)"
)


def effect_interval(fixed, other, statistic, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """Percentile bootstrap interval (95%) of ``statistic(fixed, other)``, resampling each sample's seeds apart."""
    fixed, other = np.asarray(fixed, dtype=float), np.asarray(other, dtype=float)
    rng = np.random.default_rng(seed)
    draws = [
        statistic(fixed[rng.integers(0, len(fixed), len(fixed))], other[rng.integers(0, len(other), len(other))])
        for _ in range(resamples)
    ]
    return tuple(float(v) for v in np.nanquantile(draws, [0.025, 0.975]))


def _std_ratio(a, b):
    spread = b.std(ddof=1)
    return a.std(ddof=1) / spread if spread > 0 else np.nan


def _gap_difference(a, b):
    return a.mean() - b.mean()


def effect_tests(results: pd.DataFrame, reference: str = "fixed", others=("window", "rl_halting")) -> list[str]:
    """Per task and other variant, the stopping paper's effect by EFFECT_RULE (needs ≥ 2 seeds on each side)."""
    lines = []
    if not {"task.name", "variant", "oracle_ood", "gap"} <= set(results.columns):
        return lines
    stems = results["variant"].map(variant_stem)
    for task in sorted(results["task.name"].unique()):
        base = results[(results["task.name"] == task) & (stems == reference)]
        for other in others:
            rows = results[(results["task.name"] == task) & (stems == other)]
            if len(base) < 2 or len(rows) < 2:
                continue
            fixed_ood, other_ood = numeric(base, "oracle_ood").to_numpy(), numeric(rows, "oracle_ood").to_numpy()
            fixed_gap, other_gap = 100 * numeric(base, "gap").to_numpy(), 100 * numeric(rows, "gap").to_numpy()
            ratio = effect_interval(fixed_ood, other_ood, _std_ratio)
            gaps = effect_interval(fixed_gap, other_gap, _gap_difference)
            verdict = "reproduced" if ratio[0] > 1 and gaps[0] > 0 else "not reproduced"
            lines.append(
                f"Effect test, {task}, {reference} vs {other} ({len(base)} and {len(rows)} seeds; {EFFECT_RULE}): "
                f"std ratio {_std_ratio(fixed_ood, other_ood):.2f} [{ratio[0]:.2f}, {ratio[1]:.2f}], "
                f"Gap difference {_gap_difference(fixed_gap, other_gap):.1f} pp [{gaps[0]:.1f}, {gaps[1]:.1f}]: "
                f"{verdict}."
            )
    return lines
