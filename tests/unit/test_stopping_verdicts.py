"""The stopping pages' verdict sentences: Holm by hand, p-values that decide as the rule's intervals do,
Gap bounds from the metric's definition, and the generated sentences against the committed CSVs."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from looplab.eval.grid import LengthOutcome
from looplab.eval.metrics import summarize
from looplab.report.effect import (
    bootstrap_draws,
    effect_interval,
    effect_p_values,
    f_interval,
    f_p,
    holm,
    mean_difference,
    std_ratio,
    welch_interval,
    welch_p,
)
from looplab.studies import load_studies

load_studies()

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_holm_by_hand():
    # sorted: 0.005 × 4 = 0.02, 0.01 × 3 = 0.03, 0.03 × 2 = 0.06, 0.04 × 1 = 0.04 → max(0.06, 0.04) = 0.06
    adjusted, rejected = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rejected.tolist() == [True, False, False, True]
    # an undefined p counts as 1 and is one of the m; capped at 1; an empty family rejects nothing
    adjusted, rejected = holm([0.01, math.nan, 0.6])
    assert adjusted == pytest.approx([0.03, 1.0, 1.0]) and rejected.tolist() == [True, False, False]
    assert holm([])[0].size == 0


@pytest.mark.parametrize("seed", range(12))
def test_p_values_decide_as_the_intervals_do(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(1.0, 1.0 + seed % 3, 8), rng.normal(0.0, 1.0, 9)
    assert (welch_p(a, b) < 0.05) == (welch_interval(a, b)[0] > 0)
    assert (f_p(a, b) < 0.05) == (f_interval(a, b)[0] > 1)
    if a.mean() > b.mean():  # in the claimed direction it is the two-sided test's p
        assert welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)


def test_bootstrap_draws_are_the_intervals_draws():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 2, 8), rng.normal(0, 1, 8)
    for statistic in (mean_difference, std_ratio):
        draws = bootstrap_draws(a, b, statistic, resamples=500)
        expected = effect_interval(a, b, statistic, resamples=500)
        assert tuple(np.nanquantile(draws, [0.025, 0.975])) == pytest.approx(expected, rel=1e-12)


def test_effect_p_values_of_a_clear_and_an_absent_effect():
    rng = np.random.default_rng(0)
    wide, narrow = rng.normal(0.5, 0.2, 16), rng.normal(0.5, 0.02, 16)
    clear = effect_p_values(wide, narrow, 20 + rng.normal(0, 1, 16), rng.normal(0, 1, 16))
    assert clear.gap < 0.001 and clear.std < 0.001
    absent = effect_p_values(narrow, wide, rng.normal(0, 1, 16), 20 + rng.normal(0, 1, 16))
    assert absent.gap == 1.0 and absent.std == 1.0  # the wrong direction never grants a half


def test_a_per_sample_policy_can_beat_the_oracle_so_its_gap_may_be_negative():
    from looplab.studies.earlier import gap_range

    # sample 0 is right only at K = 1, sample 1 only at K = 2: acc(K) = 0.5 for both K, Oracle 0.5
    correct = np.array([[True, False], [False, True]])
    per_sample = LengthOutcome(12, correct, np.ones((2, 1), bool), np.array([1, 2]))
    assert summarize([per_sample], train_max=10)["gap"] == pytest.approx(-0.5)
    one_depth = LengthOutcome(12, correct, np.ones((2, 1), bool), np.array([2, 2]))
    assert summarize([one_depth], train_max=10)["gap"] == pytest.approx(0.0)
    assert [gap_range(s)[0] for s in ("fixed", "matched", "window", "fixed_window", "multi_depth")] == [0.0] * 5
    assert [gap_range(s)[0] for s in ("rl_halting", "pondernet", "rl_halting-ent0")] == [-100.0] * 3


def test_confirm_cells_clip_a_gap_interval_by_schedule():
    from looplab.studies.stopping.confirm import arms_table

    rows = pd.DataFrame(
        [
            {
                "arm": arm,
                "oracle_id": 1.0,
                "oracle_ood": 0.5,
                "policy_ood": 0.5 - g,
                "gap": g,
                "flip_rate": 0.5,
                "front90": 12,
                "policy_depth_ood": 10.0,
                "block_evals": 10.0,
            }
            for arm in ("window", "rl_halting")
            for g in (0.0, 0.0, 0.0, 0.03)
        ]
    )
    window, rl = arms_table(rows).splitlines()[2:]
    assert "0.8 ± 1.5 [0.0, 3.1]" in window  # a depth rule's Gap is never below 0
    assert "0.8 ± 1.5 [-1.6, 3.1]" in rl  # a per-sample halting policy's may be


def test_the_tied_arms_read_at_min_of_t_n_and_the_horizon():
    from looplab.studies.stopping.verdicts import _depths_at

    assert _depths_at(15) == [12, 15, 15, 15, 15] and _depths_at(30) == [12, 16, 20, 25, 30]


def test_the_page_decisions_and_where_holm_changes_them():
    from looplab.report.effect import ALPHA
    from looplab.studies.stopping.verdicts import decisions, verdict_of

    found = decisions(RESULTS)
    assert len(found) == 18
    for d in found:  # the p-values decide as the rule does, and the words are the rule's
        assert (d.p.gap < ALPHA, d.p.std < ALPHA) == (d.effect.gap_holds, d.effect.std_holds)
        assert verdict_of(d.effect.gap_holds, d.effect.std_holds, d.effect) == d.effect.verdict
    changed = {
        (d.arm, d.reference, d.horizon, d.steps, d.holm_verdict) for d in found if d.holm_verdict != d.effect.verdict
    }
    assert changed == {
        ("window", "fixed", 15, 600, "Gap only"),
        ("multi_depth", "fixed", 15, 600, "Gap only"),
        ("rl_halting", "fixed", 15, 600, "Gap only"),
        ("pondernet", "fixed", 15, 600, "Gap only"),
        ("fixed_window", "fixed", 30, 600, "not reproduced"),
        ("rl_halting", "fixed", 30, 600, "not reproduced"),
    }


def test_the_claim_survives_holm_over_its_own_four_halves():
    from looplab.studies.stopping.verdicts import claim_holm, decisions

    assert claim_holm(decisions(RESULTS)) == {"window": "reproduced", "rl_halting": "reproduced"}


def test_the_committed_block_refuses_to_hide_per_length_rows(tmp_path):
    from looplab.studies.stopping.verdicts import committed_block

    shutil.copytree(RESULTS / "stopping-confirm", tmp_path / "stopping-confirm")
    assert "No committed file holds an accuracy per length" in committed_block(tmp_path)
    runs = pd.read_csv(tmp_path / "stopping-confirm" / "runs.csv")
    runs["oracle_20"] = 0.0
    runs.to_csv(tmp_path / "stopping-confirm" / "runs.csv", index=False)
    with pytest.raises(ValueError, match="per-length columns"):
        committed_block(tmp_path)


def test_aggregate_effect_without_spread_is_undecided():
    from looplab.studies.earlier import aggregate_effect, aggregate_effects

    frame = pd.read_csv(RESULTS / "stopping-pilot" / "D-binary_addition-nope-window1.csv")
    rows = frame.set_index("variant")
    result = aggregate_effect(rows.loc["fixed"], rows.loc["matched"])  # matched: every seed at 100 %
    assert math.isnan(result.ratio) and not result.std_holds and result.gap_holds
    (row,) = aggregate_effects(frame, "binary_addition", "fixed", ["matched"])
    assert row[3] == "n/a (matched: no spread)" and row[4] == "Gap half only"
