"""Seed statistics of a sweep (docs/methods.md §5): mean with its t-interval, sample std with a bootstrap interval.

Every statistic is over seeds: one value per finished run (a row of
``results.parquet``), grouped by the columns ``by``. A NaN (a metric a run did
not produce, e.g. Oracle OOD of a text run) is left out, so ``n`` may be below
the group's number of runs.

    mean            arithmetic mean over the n seeds
    std             sample standard deviation (ddof = 1); NaN for a single seed —
                    one seed says nothing about the spread, and 0 would claim it does
    ci_lo, ci_hi    95% Student-t interval of the mean, mean ± t(0.975, n − 1)·std/√n.
                    A percentile bootstrap over 3–5 seeds is far too narrow (it
                    never leaves the range of the seeds); the t-interval is honest
                    about so few. NaN for a single seed.
    std_lo, std_hi  percentile bootstrap interval of the std: resample the n seeds
                    with replacement RESAMPLES times and take the 2.5% and 97.5%
                    quantiles of the resampled stds. Each cell draws from a fresh
                    generator seeded with BOOTSTRAP_SEED, so an interval depends
                    only on its own values and a report is reproducible.

Fewer than FEW_SEEDS seeds make every interval rough; tables flag such cells.

Values stay in their summary.json units (fractions) until :func:`in_display_units`,
which turns fractions into percent and Gap into percentage points.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

BOOTSTRAP_SEED = 0
RESAMPLES = 10_000
LEVEL = 0.95
FEW_SEEDS = 5  # below this, a table marks the seed count and says why

# the paper-1 headline metrics (docs/methods.md §5), in table order
HEADLINE_METRICS = ("oracle_id", "oracle_ood", "policy_ood", "gap", "front90", "flip_rate", "training_cost.block_evals")
# test-time scaling (docs/methods.md §6): the eval summary's keys, then the report's derived ones
SCALING_METRICS = (
    "scaling_peak",
    "scaling_peak_loops",
    "relative_drop",
    "relative_drop_4_to_8",
    "accuracy_min_4_to_100",
    "nonfinite_last",
)
# text runs (eval/lm_summary.json): validation loss against loops
LM_METRICS = (
    "lm.loss_at_training_depth",
    "lm.bits_per_byte_at_training_depth",
    "lm.best_loss",
    "lm.best_loops",
    "lm.loss_at_max_loops",
    "lm.scaling.id.at_depth",
    "lm.scaling.id.at_twice_depth",
    "lm.scaling.id.relative_drop",
    "lm.scaling.id.best",
    "lm.scaling.id.best_loops",
    "lm.scaling.ood.best",
    "lm.scaling.loss.relative_drop",
    "lm.scaling.state_norm_growth",
    "lm.scaling.spectral_radius_at_max_loops",
)
# analysis.* keys that record how the analysis was run, not what it found
ANALYSIS_PARAMETERS = frozenset(
    {
        "analysis.loops",
        "analysis.samples",
        "analysis.length",
        "analysis.checkpoint",
        "analysis.token_dynamics.tokens",
        "analysis.token_dynamics.window",
        "analysis.token_dynamics.tol",
    }
)

PERCENT_METRICS = frozenset(
    {
        "oracle_id",
        "oracle_ood",
        "policy_id",
        "policy_ood",
        "flip_rate",
        "scaling_peak",
        "relative_drop",
        "relative_drop_4_to_8",
        "accuracy_min_4_to_100",
        "nonfinite_last",
        "lm.scaling.id.at_depth",
        "lm.scaling.id.at_twice_depth",
        "lm.scaling.id.relative_drop",
        "lm.scaling.id.best",
        "lm.scaling.ood.best",
        "lm.scaling.loss.relative_drop",
        "halting_inference.on_id",
        "halting_inference.on_ood",
        "halting_inference.off_id",
        "halting_inference.off_ood",
    }
)
POINT_METRICS = frozenset({"gap"})  # a difference of two percentages
#: the range a metric's values can take (fractions); a mean's interval is clipped to it (:func:`metric_range`)
BOUNDS = {
    **{
        metric: (0.0, 1.0)
        for metric in PERCENT_METRICS
        if metric not in ("relative_drop_4_to_8", "lm.scaling.loss.relative_drop")
    },
    "relative_drop_4_to_8": (-np.inf, 1.0),  # the accuracy at 8 loops may exceed that at 4
    # Oracle − Policy: never negative for a rule schedule (one depth per length, and Oracle is the best
    # one), but a learned halting policy reads each sample at its own depth and may beat every single K
    "gap": (-1.0, 1.0),
}

STATS = ("n", "mean", "std", "ci_lo", "ci_hi", "std_lo", "std_hi")


def numeric(results: pd.DataFrame, column: str) -> pd.Series:
    """The column as floats; None, JSON strings and other non-numbers become NaN."""
    return pd.to_numeric(results[column], errors="coerce").astype(float)


def present(results: pd.DataFrame, candidates) -> list[str]:
    """The candidate columns that exist and hold at least one finite number, in the given order."""
    return [c for c in candidates if c in results.columns and np.isfinite(numeric(results, c)).any()]


def analysis_metrics(results: pd.DataFrame) -> list[str]:
    """Numeric ``analysis.*`` columns (mechanistic findings), sorted; run parameters excluded."""
    columns = [c for c in results.columns if c.startswith("analysis.") and c not in ANALYSIS_PARAMETERS]
    return present(results, sorted(columns))


@lru_cache(maxsize=8)
def _resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, n] indices into n seeds; shared by every cell with n seeds (same seed, same draw)."""
    indices = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    indices.setflags(write=False)
    return indices


def t_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean of ``values`` [n]; (NaN, NaN) when n < 2."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return float("nan"), float("nan")
    half = scipy_stats.t.ppf((1 + level) / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return float(values.mean() - half), float(values.mean() + half)


def chi2_std_interval(std: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Interval of σ from a sample std over n values (exact under normality):
    σ ∈ [s √((n−1)/χ²_{(1+level)/2}), s √((n−1)/χ²_{(1−level)/2})]; (NaN, NaN) when n < 2."""
    if n < 2 or not np.isfinite(std):
        return float("nan"), float("nan")
    lo, hi = (std * np.sqrt((n - 1) / scipy_stats.chi2.ppf(q, n - 1)) for q in ((1 + level) / 2, (1 - level) / 2))
    return float(lo), float(hi)


def bootstrap_ci(
    values, statistic=np.mean, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = LEVEL
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` (applied along axis 1 to [resamples, n] draws)
    of ``values`` [n]; (NaN, NaN) when n = 0."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return float("nan"), float("nan")
    resampled = statistic(values[_resample_indices(values.size, resamples, seed)], axis=1)
    lo, hi = np.quantile(resampled, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _sample_std(draws: np.ndarray, axis: int) -> np.ndarray:
    return draws.std(axis=axis, ddof=1)


def seed_stats(values) -> dict[str, float]:
    """n, mean, std (ddof = 1), the mean's t-interval and the std's bootstrap interval, over the finite
    entries of ``values``."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    n = values.size
    lo, hi = t_interval(values)
    std_lo, std_hi = bootstrap_ci(values, _sample_std) if n > 1 else (float("nan"), float("nan"))
    return {
        "n": n,
        "mean": float(values.mean()) if n else float("nan"),
        "std": float(values.std(ddof=1)) if n > 1 else float("nan"),
        "ci_lo": lo,
        "ci_hi": hi,
        "std_lo": std_lo,
        "std_hi": std_hi,
    }


def group_sizes(results: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One row per group, sorted: ``by``..., ``runs`` (finished runs, i.e. seeds, in the group) and,
    when results record a ``status``, ``diverged`` (runs whose training diverged: no metrics, so n < runs).
    """
    grouped = results.groupby(by, dropna=False, sort=True)
    sizes = grouped.size().rename("runs").reset_index()
    if "status" in results.columns:
        sizes["diverged"] = grouped["status"].agg(lambda s: int((s == "diverged").sum())).to_numpy()
    return sizes


def aggregate(results: pd.DataFrame, by: list[str], metrics: list[str]) -> pd.DataFrame:
    """Long table, one row per (group, metric), groups sorted as :func:`group_sizes`.

    Columns: ``by``..., ``metric``, n, mean, std, ci_lo, ci_hi, std_lo, std_hi. The mean's t-interval
    is clipped to the metric's range (``BOUNDS``): an accuracy's never passes 100 %.
    """
    values = pd.DataFrame({m: numeric(results, m) for m in metrics}, index=results.index)
    rows = []
    for key, group in results.groupby(by, dropna=False, sort=True):
        key = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        rows += [{**key, "metric": m, **bounded(m, seed_stats(values.loc[group.index, m]))} for m in metrics]
    return pd.DataFrame(rows, columns=[*by, "metric", *STATS])


def metric_range(metric: str) -> tuple[float, float]:
    """The values ``metric`` can take: its ``BOUNDS`` entry, else what its name says it is (an analysis
    metric's): a cosine lies in −1..1, a fraction or share in 0..1, a norm, ratio or ColSum is at least 0;
    anything else is unbounded."""
    if metric in BOUNDS:
        return BOUNDS[metric]
    name = metric.removeprefix("analysis.")
    if "cos" in name:
        return -1.0, 1.0
    if "fraction" in name or "share" in name or name.startswith("token_dynamics."):
        return 0.0, 1.0
    if any(word in name for word in ("norm", "ratio", "colsum")):
        return 0.0, np.inf
    return -np.inf, np.inf


def bounded(metric: str, stats: dict[str, float]) -> dict[str, float]:
    """``stats`` with the mean's interval clipped to the range of ``metric`` (unchanged when it has none)."""
    low, high = metric_range(metric)
    if np.isfinite(stats["ci_lo"]):
        stats["ci_lo"], stats["ci_hi"] = max(stats["ci_lo"], low), min(stats["ci_hi"], high)
    return stats


def unit(metric: str) -> str:
    """ "%" for fractions shown in percent, "pp" for Gap, "" for lengths, counts and cosines."""
    if metric in PERCENT_METRICS:
        return "%"
    return "pp" if metric in POINT_METRICS else ""


def in_display_units(long: pd.DataFrame) -> pd.DataFrame:
    """``long`` with mean, std and the interval scaled to display units and a ``unit`` column.

    A percent metric's std is in percentage points (the paper's "Std (pp)").
    """
    long = long.copy()
    long["unit"] = long["metric"].map(unit)
    scale = np.where(long["unit"] == "", 1.0, 100.0)
    for stat in ("mean", "std", "ci_lo", "ci_hi", "std_lo", "std_hi"):
        long[stat] = long[stat] * scale
    return long


def seed_cell(values: pd.Series, scale: float = 100.0, digits: int = 1, bounds=(0.0, 1.0)) -> str:
    """mean ± std [95 % t-interval, clipped to ``bounds``] over seeds; "n/a (0 seeds)" when none, and a
    spread of zero said as such (every seed gave the same value)."""
    values = values.dropna().to_numpy(dtype=float)
    if len(values) == 0:
        return "n/a (0 seeds)"
    mean = scale * values.mean()
    if len(values) < 2:
        return f"{mean:.{digits}f} (1 seed)"
    if values.std(ddof=1) == 0:
        return f"{mean:.{digits}f} (all {len(values)} seeds equal)"
    low, high = t_interval(values)
    low, high = scale * max(low, bounds[0]), scale * min(high, bounds[1])
    return f"{mean:.{digits}f} ± {scale * values.std(ddof=1):.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
