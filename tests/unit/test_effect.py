"""The effect test's statistics (looplab/report/effect.py) against hand computation and their rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from looplab.report.effect import Effect, brown_forsythe, effect, f_interval, welch_interval

A = np.array([0.1, 0.5, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4])
B = np.array([0.50, 0.51, 0.49, 0.50, 0.52, 0.48, 0.50, 0.51])


def test_welch_interval_matches_scipy():
    low, high = welch_interval(A, B)
    expected = stats.ttest_ind(A, B, equal_var=False).confidence_interval(0.95)
    assert (low, high) == pytest.approx((expected.low, expected.high))


def test_f_interval_by_hand():
    # s_A² / s_B² and the F(7, 7) quantiles, written out
    ratio = A.var(ddof=1) / B.var(ddof=1)
    hi_q, lo_q = stats.f.ppf(0.975, 7, 7), stats.f.ppf(0.025, 7, 7)
    assert f_interval(A, B) == pytest.approx((math.sqrt(ratio / hi_q), math.sqrt(ratio / lo_q)))
    # symmetric: swapping the samples inverts the interval
    low, high = f_interval(B, A)
    assert (low, high) == pytest.approx((1 / f_interval(A, B)[1], 1 / f_interval(A, B)[0]))


def test_f_interval_covers_at_its_level_under_the_null():
    rng = np.random.default_rng(0)
    covered = [lo <= 1 <= hi for lo, hi in (f_interval(rng.normal(size=8), rng.normal(size=8)) for _ in range(4000))]
    assert np.mean(covered) == pytest.approx(0.95, abs=0.015)


def test_brown_forsythe_is_anova_on_deviations_from_the_median():
    deviations = [np.abs(A - np.median(A)), np.abs(B - np.median(B))]
    assert brown_forsythe(A, B) == pytest.approx(stats.f_oneway(*deviations).pvalue)
    assert math.isnan(brown_forsythe([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]))  # no spread anywhere: undefined


def _effect(**changes) -> Effect:
    passing = dict(
        seeds=(16, 16),
        gap_difference=20.0,
        gap_welch=(10.0, 30.0),
        gap_bootstrap=(11.0, 29.0),
        ratio=2.0,
        ratio_f=(1.2, 3.5),
        ratio_bootstrap=(1.1, 3.9),
        brown_forsythe_p=0.01,
    )
    return Effect(**(passing | changes))


@pytest.mark.parametrize(
    "changes, verdict",
    [
        ({}, "reproduced"),
        ({"ratio_f": (0.87, 4.36)}, "Gap only"),  # the F-interval alone reaches below 1
        ({"ratio_bootstrap": (0.99, 4.0)}, "Gap only"),
        ({"brown_forsythe_p": 0.2}, "Gap only"),
        ({"brown_forsythe_p": math.nan}, "Gap only"),
        ({"gap_welch": (-1.0, 30.0)}, "Std only"),  # the Welch interval alone reaches below 0
        ({"gap_bootstrap": (-0.1, 30.0)}, "Std only"),
        ({"gap_welch": (-1.0, 3.0), "ratio_f": (0.5, 2.0)}, "not reproduced"),
        ({"seeds": (4, 16)}, "inconclusive (4 seeds)"),  # below five seeds nothing is decided
    ],
    ids=["all", "f", "bootstrap-ratio", "bf", "bf-undefined", "welch", "bootstrap-gap", "neither", "few"],
)
def test_verdict_takes_the_most_conservative_method(changes, verdict):
    assert _effect(**changes).verdict == verdict


def test_effect_from_seed_values():
    result = effect(A, B, 100 * A, 100 * B / 10)
    assert result.seeds == (8, 8)
    assert result.ratio == pytest.approx(A.std(ddof=1) / B.std(ddof=1))
    assert result.gap_difference == pytest.approx(100 * A.mean() - 10 * B.mean())
    assert result.verdict == "reproduced"
    # a NaN seed (an undefined metric) is left out, not counted as 0
    with_nan = effect(np.append(A, np.nan), B, 100 * np.append(A, np.nan), 100 * B / 10)
    assert with_nan.seeds == (8, 8) and with_nan.ratio == pytest.approx(result.ratio)


def test_effect_below_two_seeds_is_undefined_and_inconclusive():
    result = effect([0.5], B, [10.0], B)
    assert result.seeds == (1, 8) and result.verdict == "inconclusive (1 seeds)"
    assert math.isnan(result.ratio) and all(math.isnan(v) for v in (*result.ratio_f, *result.gap_welch))
    assert effect([], [], [], []).verdict == "inconclusive (0 seeds)"
