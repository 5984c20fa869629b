"""The stopping paper's effect test: does a schedule cut the Gap and the seed-to-seed spread of ``fixed``?

Two halves, each decided by the most conservative of several intervals or tests (a verdict
that one method alone would grant is not granted):

    Gap half   Gap(ref) − Gap(other) > 0: the lower ends of the 95% Welch t-interval and of the
               95% percentile bootstrap interval both lie above 0.
    Std half   std(ref) / std(other) > 1 for Oracle OOD: the lower ends of the 95% F-interval
               (√ of the variance-ratio interval) and of the 95% percentile bootstrap interval
               both lie above 1, and the Brown–Forsythe test (Levene's, median-centred) gives
               p < 0.05.

Verdict: "reproduced" (both halves), "Gap only", "Std only", "not reproduced"; with fewer than
FEW_SEEDS seeds on either side, "inconclusive (n seeds)" whatever the intervals say. The bootstrap
resamples each side's seeds apart (RESAMPLES draws from a generator seeded with BOOTSTRAP_SEED).

Why all three for the spread: at 8 seeds the percentile bootstrap of a std ratio is too narrow
(its lower end clears 1 in 3.3% of 2000 simulations of two normal samples with equal spreads,
against the nominal 2.5%); the F-interval is exact for normal data but fragile to outliers;
Brown–Forsythe is robust to non-normality.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from looplab.report.aggregate import BOOTSTRAP_SEED, FEW_SEEDS, LEVEL, RESAMPLES

EFFECT_RULE = (
    "reproduced when Gap(fixed) − Gap(other) > 0 by both the Welch t- and the bootstrap 95% interval, and "
    "std(fixed) / std(other) of Oracle OOD > 1 by the F-interval, the bootstrap interval and the Brown–Forsythe "
    f"test (p < 0.05) together; inconclusive below {FEW_SEEDS} seeds"
)
ALPHA = 1 - LEVEL


def effect_interval(fixed, other, statistic, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """Percentile bootstrap interval (95%) of ``statistic(fixed, other)``, resampling each sample's seeds apart
    (:func:`bootstrap_draws`)."""
    draws = bootstrap_draws(fixed, other, statistic, resamples, seed)
    return tuple(float(v) for v in np.nanquantile(draws, [ALPHA / 2, 1 - ALPHA / 2]))


def std_ratio(a, b) -> float:
    """std(a) / std(b) (ddof = 1); NaN when b has no spread."""
    spread = np.std(b, ddof=1)
    return float(np.std(a, ddof=1) / spread) if spread > 0 else float("nan")


def mean_difference(a, b) -> float:
    return float(np.mean(a) - np.mean(b))


def welch_interval(a, b, level: float = LEVEL) -> tuple[float, float]:
    """Welch t-interval of mean(a) − mean(b) (unequal variances, Welch–Satterthwaite degrees of freedom)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return welch_from_stats(a.mean(), a.std(ddof=1), a.size, b.mean(), b.std(ddof=1), b.size, level)


def welch_from_stats(mean_a, std_a, n_a, mean_b, std_b, n_b, level: float = LEVEL) -> tuple[float, float]:
    """:func:`welch_interval` from each sample's mean, std (ddof = 1) and size alone."""
    va, vb = std_a**2 / n_a, std_b**2 / n_b
    difference = float(mean_a - mean_b)
    if va + vb == 0:
        return difference, difference
    dof = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    half = float(scipy_stats.t.ppf((1 + level) / 2, dof) * np.sqrt(va + vb))
    return difference - half, difference + half


def f_interval(a, b, level: float = LEVEL) -> tuple[float, float]:
    """Interval of σ_a / σ_b from the F distribution of the variance ratio (exact under normality)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return f_from_stats(a.std(ddof=1), a.size, b.std(ddof=1), b.size, level)


def f_from_stats(std_a, n_a, std_b, n_b, level: float = LEVEL) -> tuple[float, float]:
    """:func:`f_interval` from each sample's std (ddof = 1) and size alone.

    With R = s_a² / s_b² and F_q the q-quantile of F(n_a − 1, n_b − 1):
    σ_a² / σ_b² ∈ [R / F_{1−α/2}, R / F_{α/2}]; the square root gives the std ratio's interval.
    """
    if std_b == 0:
        return float("nan"), float("nan")
    ratio = std_a**2 / std_b**2
    upper_q, lower_q = scipy_stats.f.ppf([(1 + level) / 2, (1 - level) / 2], n_a - 1, n_b - 1)
    return float(np.sqrt(ratio / upper_q)), float(np.sqrt(ratio / lower_q))


def brown_forsythe(a, b) -> float:
    """p-value of the Brown–Forsythe test of equal spreads (Levene's test centred at the median)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return float("nan")
    return float(scipy_stats.levene(a, b, center="median").pvalue)


@dataclass(frozen=True)
class Effect:
    """The effect test of one arm against the reference: both halves, every interval, the verdict.

    Gap values in the units given (pp in reports); Oracle OOD spreads as a unit-free ratio.
    """

    seeds: tuple[int, int]
    gap_difference: float
    gap_welch: tuple[float, float]
    gap_bootstrap: tuple[float, float]
    ratio: float
    ratio_f: tuple[float, float]
    ratio_bootstrap: tuple[float, float]
    brown_forsythe_p: float

    @property
    def gap_holds(self) -> bool:
        return min(self.gap_welch[0], self.gap_bootstrap[0]) > 0

    @property
    def std_holds(self) -> bool:
        return (
            min(self.ratio_f[0], self.ratio_bootstrap[0]) > 1
            and self.ratio > 1
            and self.brown_forsythe_p < ALPHA  # NaN (no spread on either side) never passes
        )

    @property
    def few(self) -> bool:
        return min(self.seeds) < FEW_SEEDS

    @property
    def verdict(self) -> str:
        if self.few:
            return f"inconclusive ({min(self.seeds)} seeds)"
        if self.gap_holds and self.std_holds:
            return "reproduced"
        if self.gap_holds or self.std_holds:
            return "Gap only" if self.gap_holds else "Std only"
        return "not reproduced"


def effect(ref_ood, other_ood, ref_gap, other_gap) -> Effect:
    """The effect test of ``other`` against ``ref`` from per-seed Oracle OOD and Gap values (NaNs dropped)."""
    clean = [np.asarray(v, dtype=float) for v in (ref_ood, other_ood, ref_gap, other_gap)]
    ref_ood, other_ood, ref_gap, other_gap = (v[np.isfinite(v)] for v in clean)
    seeds = (min(ref_ood.size, ref_gap.size), min(other_ood.size, other_gap.size))
    if min(seeds) < 2:  # nothing to estimate a spread from: every interval undefined, the verdict inconclusive
        nan, nans = float("nan"), (float("nan"), float("nan"))
        return Effect(seeds, nan, nans, nans, nan, nans, nans, nan)
    return Effect(
        seeds=seeds,
        gap_difference=mean_difference(ref_gap, other_gap),
        gap_welch=welch_interval(ref_gap, other_gap),
        gap_bootstrap=effect_interval(ref_gap, other_gap, mean_difference),
        ratio=std_ratio(ref_ood, other_ood),
        ratio_f=f_interval(ref_ood, other_ood),
        ratio_bootstrap=effect_interval(ref_ood, other_ood, std_ratio),
        brown_forsythe_p=brown_forsythe(ref_ood, other_ood),
    )


def describe(result: Effect) -> str:
    """One line: the Gap difference with both intervals, the std ratio with its intervals and test, the verdict."""
    return (
        f"Gap difference {result.gap_difference:.1f} pp (Welch [{result.gap_welch[0]:.1f}, {result.gap_welch[1]:.1f}], "
        f"bootstrap [{result.gap_bootstrap[0]:.1f}, {result.gap_bootstrap[1]:.1f}]); std ratio {result.ratio:.2f} "
        f"(F [{result.ratio_f[0]:.2f}, {result.ratio_f[1]:.2f}], bootstrap [{result.ratio_bootstrap[0]:.2f}, "
        f"{result.ratio_bootstrap[1]:.2f}], Brown–Forsythe p = {result.brown_forsythe_p:.3f}): {result.verdict}"
    )


def comparison_line(question, arm, other, a, b, metric, above, below, margin_pp=None) -> str:
    """One decision of a frozen protocol: ``arm`` − ``other`` on ``metric`` (fractions a, b over seeds),
    the Welch 95 % interval in points, and the verdict: ``above`` / ``below`` when the interval excludes 0,
    "matches" when ``margin_pp`` is given and the interval lies within ±margin_pp, else "not resolved";
    "n/a" with the seed counts below two seeds a side."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return f"{question}: {arm} vs {other}: n/a ({len(a)} and {len(b)} seeds; needs 2 each)"
    low, high = welch_interval(a, b)
    if margin_pp is not None and -margin_pp / 100 <= low and high <= margin_pp / 100:
        verdict = f"matches (within ±{margin_pp:g} pp)"
    else:
        verdict = above if low > 0 else below if high < 0 else "not resolved"
    few = f" (few seeds: {min(len(a), len(b))})" if min(len(a), len(b)) < FEW_SEEDS else ""
    return (
        f"{question}: {arm} − {other}, {metric} {points(a.mean() - b.mean())} pp, Welch 95% "
        f"[{points(low)}, {points(high)}] ({len(a)} vs {len(b)} seeds){few}: {verdict}"
    )


def points(value: float) -> str:
    """A difference of fractions in signed percentage points; "n/a" when undefined."""
    return "n/a" if not np.isfinite(value) else f"{100 * value:+.1f}"


# ----------------------------------------------------------------------------- p-values and Holm
#
# The rule decides by intervals; each interval has a test that rejects exactly when the interval excludes
# the null, so a half's decision has a p-value: the test's p in the claimed direction, doubled (the 95 %
# two-sided interval's lower end clears the null exactly when that p is below 0.05). A half needs all its
# tests, so its p-value is the largest of theirs (an intersection–union test): below α exactly when the
# rule grants the half.


def welch_p(a, b) -> float:
    """p of mean(a) − mean(b) > 0 by Welch's t-test, 2 × one-sided (< α ⟺ the Welch interval's low end > 0)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if np.var(a) + np.var(b) == 0:
        return 0.0 if a.mean() > b.mean() else 1.0
    one_sided = scipy_stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    return float(min(1.0, 2 * one_sided))


def f_p(a, b) -> float:
    """p of σ_a / σ_b > 1 by the F-test of the variance ratio, 2 × one-sided (< α ⟺ the F-interval's
    low end > 1); NaN when b has no spread."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    spread = b.var(ddof=1)
    if spread == 0:
        return float("nan")
    return float(min(1.0, 2 * scipy_stats.f.sf(a.var(ddof=1) / spread, a.size - 1, b.size - 1)))


def bootstrap_draws(fixed, other, statistic, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[resamples] ``statistic`` of resampled seeds: the draws :func:`effect_interval` takes quantiles of."""
    fixed, other = np.asarray(fixed, dtype=float), np.asarray(other, dtype=float)
    rng = np.random.default_rng(seed)
    return np.array(
        [
            statistic(fixed[rng.integers(0, len(fixed), len(fixed))], other[rng.integers(0, len(other), len(other))])
            for _ in range(resamples)
        ]
    )


def bootstrap_p(draws, null: float) -> float:
    """p of a statistic > ``null`` from its bootstrap draws: 2 × the share of (finite) draws at or below
    ``null`` (< α ⟺ the percentile interval's low end > null, to the resolution 1 / resamples)."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    return float("nan") if draws.size == 0 else float(min(1.0, 2 * np.mean(draws <= null)))


@dataclass(frozen=True)
class EffectP:
    """The p-values of the effect test's tests of one arm against the reference (each < α ⟺ its part holds)."""

    gap_welch: float
    gap_bootstrap: float
    ratio_f: float
    ratio_bootstrap: float
    brown_forsythe: float  # the test's p when the ratio is above 1, else 1 (the rule needs both)

    @property
    def gap(self) -> float:
        """The Gap half's p: the larger of Welch's and the bootstrap's."""
        return _largest(self.gap_welch, self.gap_bootstrap)

    @property
    def std(self) -> float:
        """The Std half's p: the largest of the F-test's, the bootstrap's and Brown–Forsythe's."""
        return _largest(self.ratio_f, self.ratio_bootstrap, self.brown_forsythe)


def _largest(*values: float) -> float:
    """The largest p; an undefined one (NaN) counts as 1: an undefined test never grants a half."""
    return max(1.0 if not np.isfinite(v) else v for v in values)


def effect_p_values(ref_ood, other_ood, ref_gap, other_gap) -> EffectP:
    """:class:`EffectP` of ``other`` against ``ref`` from the values :func:`effect` takes (NaNs dropped)."""
    clean = [np.asarray(v, dtype=float) for v in (ref_ood, other_ood, ref_gap, other_gap)]
    ref_ood, other_ood, ref_gap, other_gap = (v[np.isfinite(v)] for v in clean)
    if min(ref_ood.size, other_ood.size, ref_gap.size, other_gap.size) < 2:
        return EffectP(*(float("nan"),) * 5)
    ratio = std_ratio(ref_ood, other_ood)
    return EffectP(
        gap_welch=welch_p(ref_gap, other_gap),
        gap_bootstrap=bootstrap_p(bootstrap_draws(ref_gap, other_gap, mean_difference), 0.0),
        ratio_f=f_p(ref_ood, other_ood),
        ratio_bootstrap=bootstrap_p(bootstrap_draws(ref_ood, other_ood, std_ratio), 1.0),
        brown_forsythe=brown_forsythe(ref_ood, other_ood) if ratio > 1 else 1.0,
    )


def holm(p_values, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """Holm–Bonferroni step-down over m p-values: (adjusted p-values [m], decisions [m] bool).

    With p sorted ascending, p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)); a hypothesis is rejected when
    its p̃ is below ``alpha`` (the protocols' "p < α"). This controls the chance of any false rejection
    among the m at ``alpha``. An undefined p (NaN) counts as 1: it is one of the m and is never rejected.
    """
    p = np.asarray(p_values, dtype=float)
    p = np.where(np.isfinite(p), p, 1.0)
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped) if m else stepped
    return adjusted, adjusted < alpha


# ----------------------------------------------------------------------------- p-values of interval rules
#
# A frozen rule that reads a 95 % t-interval against a line (0, a threshold, or ±margin) has a t-test that
# decides exactly as it does: :func:`direction_p` (two-sided: < α ⟺ the interval excludes the line) and
# :func:`within_p` (the two one-sided tests, each doubled: < α ⟺ the interval lies within ±margin).


def one_sided_p(estimate: float, se: float, dof: float, null: float, greater: bool) -> float:
    """p of a t statistic (estimate − null) / se against ``null``, one-sided (estimate > null when
    ``greater``); with no spread, 0 when the estimate lies on the claimed side, else 1."""
    if se == 0 or not np.isfinite(se):
        return 0.0 if (estimate > null if greater else estimate < null) else 1.0
    t = (estimate - null) / se
    return float(scipy_stats.t.sf(t, dof) if greater else scipy_stats.t.cdf(t, dof))


def welch_se(a, b) -> tuple[float, float, float]:
    """(mean(a) − mean(b), its standard error, Welch–Satterthwaite degrees of freedom)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)) if va + vb > 0 else np.inf
    return float(a.mean() - b.mean()), float(np.sqrt(va + vb)), float(dof)


def mean_se(values) -> tuple[float, float, float]:
    """(mean of ``values``, its standard error, n − 1): a one-sample or paired t-test's parts."""
    d = np.asarray(values, dtype=float)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size)), float(d.size - 1)


def direction_p(estimate: float, se: float, dof: float, null: float = 0.0) -> float:
    """p of "the estimate is not ``null``", two-sided: < α ⟺ the 95 % t-interval excludes ``null``."""
    above, below = one_sided_p(estimate, se, dof, null, True), one_sided_p(estimate, se, dof, null, False)
    return min(1.0, 2 * min(above, below))


def within_p(estimate: float, se: float, dof: float, margin: float) -> float:
    """TOST p of "the difference lies within ±margin": the larger of the two one-sided tests', each doubled
    (< α ⟺ the 95 % interval lies within ±margin)."""
    low = one_sided_p(estimate, se, dof, -margin, True)
    high = one_sided_p(estimate, se, dof, margin, False)
    return min(1.0, 2 * max(low, high))
