"""Paper-1 metrics (docs/methods.md §5) on hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from looplab.eval.grid import LengthOutcome, grid_frame
from looplab.eval.metrics import flip_curve, flip_rate, front_at, summarize

# ----------------------------------------------------------------------------- front@90


def test_front_all_pass():
    assert front_at({4: 1.0, 8: 0.95, 12: 0.9, 16: 0.92}, train_max=8) == 16


def test_front_threshold_is_inclusive():
    assert front_at({4: 1.0, 8: 0.9, 12: 0.89999}, train_max=8) == 8
    assert front_at({4: 1.0, 8: 0.6, 12: 0.59}, train_max=4, threshold=0.6) == 8


def test_front_first_ood_fails_gives_train_max():
    # train_max = 10 is not evaluated; the front is still the largest training length
    assert front_at({4: 1.0, 8: 1.0, 12: 0.5, 16: 1.0}, train_max=10) == 10
    assert front_at({4: 1.0, 8: 1.0, 12: 0.0}, train_max=8) == 8


def test_front_id_length_fails_gives_largest_passing_prefix():
    assert front_at({4: 1.0, 8: 0.5, 12: 1.0, 16: 1.0}, train_max=10) == 4


@pytest.mark.parametrize(
    "oracle, train_max",
    [
        ({4: 0.2, 8: 1.0, 12: 1.0}, 10),  # the smallest (ID) length fails: no L passes
        ({12: 0.5, 16: 1.0}, 10),  # no training length evaluated and the first OOD one fails
        ({}, 10),  # nothing evaluated
    ],
    ids=["first-id-fails", "no-id-first-ood-fails", "empty"],
)
def test_front_undefined_is_none(oracle, train_max):
    assert front_at(oracle, train_max) is None


def test_front_passes_with_a_gap_later():
    # 20 passes again but 16 failed: the front stops at 12
    assert front_at({4: 1.0, 8: 1.0, 12: 1.0, 16: 0.2, 20: 1.0}, train_max=8) == 12


def test_front_ignores_dict_order():
    assert front_at({16: 0.2, 4: 1.0, 12: 1.0, 8: 1.0}, train_max=8) == 12


# ----------------------------------------------------------------------------- flip rate


def test_flip_curve_by_hand():
    flips = np.array([[1, 0, 1, 0], [0, 0, 0, 1]], dtype=bool)  # T = 5; column K-1 is K → K+1
    assert flip_curve(flips) == pytest.approx([0.5, 0.0, 0.5, 0.5])
    assert np.isnan(flip_curve(np.zeros((0, 3), dtype=bool))).all()  # no samples: undefined at every K


def test_flip_rate_over_a_common_range_by_hand():
    flips = np.array([[1, 0, 1, 0], [0, 0, 0, 1]], dtype=bool)
    # K = 1..4: 3 flips of 8 pairs
    assert flip_rate(flips) == (pytest.approx(3 / 8), 8)
    # K = 3..4: columns 2, 3 → 1 + 0 + 0 + 1 = 2 of 4, whatever each sample's own policy depth
    assert flip_rate(flips, flip_from=3) == (pytest.approx(0.5), 4)
    assert flip_rate(flips, flip_from=4) == (pytest.approx(0.5), 2)


@pytest.mark.parametrize(
    "flips, flip_from",
    [
        (np.zeros((3, 0), dtype=bool), 1),  # one loop read: no pair of depths
        (np.ones((2, 2), dtype=bool), 3),  # the range [3, 2] is empty
        (np.zeros((0, 4), dtype=bool), 1),  # no samples
    ],
    ids=["one-loop", "empty-range", "no-samples"],
)
def test_flip_rate_undefined_is_nan_not_zero(flips, flip_from):
    value, pairs = flip_rate(flips, flip_from)
    assert math.isnan(value) and pairs == 0


# ----------------------------------------------------------------------------- summarize / grid


def _b(rows) -> np.ndarray:
    return np.array(rows, dtype=bool)


def synthetic_outcomes() -> list[LengthOutcome]:
    """train_max = 4; T = 3 loops; N = 4 samples per length."""
    id2 = LengthOutcome(
        2,
        _b([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 0]]),  # acc .5 1 .75
        _b([[0, 0]] * 4),
        np.array([2, 2, 2, 2]),
    )
    id4 = LengthOutcome(
        4,
        _b([[1, 1, 1], [0, 1, 1], [0, 0, 1], [0, 0, 0]]),  # acc .25 .5 .75
        _b([[0, 0]] * 4),
        np.array([3, 3, 3, 3]),
    )
    ood6 = LengthOutcome(
        6,
        _b([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 0]]),  # acc .75 .75 .25
        _b([[0, 1], [1, 0], [0, 0], [1, 1]]),
        np.array([3, 3, 3, 3]),
    )
    ood8 = LengthOutcome(
        8,
        _b([[0, 1, 0], [0, 0, 0], [0, 1, 1], [1, 1, 0]]),  # acc .25 .75 .25
        _b([[1, 1], [0, 0], [0, 0], [1, 0]]),
        np.array([1, 2, 3, 3]),
    )
    return [id2, id4, ood6, ood8]


def test_length_outcome_properties():
    o = synthetic_outcomes()[3]
    assert np.allclose(o.accuracy, [0.25, 0.75, 0.25])
    # depths 1, 2, 3, 3 → row answers 0, 0, 1, 0
    assert o.policy_accuracy == pytest.approx(0.25)


def test_summarize_by_hand():
    s = summarize(synthetic_outcomes(), train_max=4)
    assert s["oracle_id"] == pytest.approx((1.0 + 0.75) / 2)
    assert s["oracle_ood"] == pytest.approx((0.75 + 0.75) / 2)
    assert s["policy_id"] == pytest.approx((1.0 + 0.75) / 2)  # id2 at K=2: 1.0; id4 at K=3: .75
    assert s["policy_ood"] == pytest.approx((0.25 + 0.25) / 2)  # ood6 at K=3: .25; ood8: .25
    assert s["gap"] == pytest.approx(0.5)
    assert s["front90"] == 2  # length 4 (ID) fails at .75
    # curve over the 8 OOD rows: column 0 → 0+1+0+1 + 1+0+0+1 = 4/8; column 1 → 1+0+0+1 + 1+0+0+0 = 3/8
    assert s["flip_curve"] == pytest.approx([0.5, 0.375])
    # the scalar: every OOD (sample, K) pair in K = 1..2, whatever each sample's policy depth: 7 of 16
    assert s["flip_rate"] == pytest.approx(7 / 16)
    assert s["flip_range"] == [1, 2]
    assert s["counts"] == {"id_lengths": 2, "ood_lengths": 2, "lengths": 4, "flip_pairs": 16}

    per = s["per_length"]
    assert set(per) == {"2", "4", "6", "8"}
    assert per["2"] == pytest.approx(
        {"split": "id", "oracle": 1.0, "best_k": 2, "policy": 1.0, "policy_depth": 2.0, "flip_rate": 0.0}
    )
    assert per["4"]["best_k"] == 3 and per["4"]["oracle"] == pytest.approx(0.75)
    assert per["6"]["split"] == "ood" and per["6"]["best_k"] == 1  # first of the tied maxima
    assert per["6"]["flip_rate"] == pytest.approx(4 / 8)  # ood6 flips: 0 1 / 1 0 / 0 0 / 1 1
    assert per["8"]["policy_depth"] == pytest.approx(2.25)
    assert per["8"]["flip_rate"] == pytest.approx(3 / 8)  # ood8 flips: 1 1 / 0 0 / 0 0 / 1 0
    assert per["8"]["best_k"] == 2


def test_summarize_front_when_first_ood_fails():
    outcomes = synthetic_outcomes()
    outcomes[1] = LengthOutcome(4, _b([[1, 1, 1]] * 4), _b([[0, 0]] * 4), np.array([3, 3, 3, 3]))
    s = summarize(outcomes, train_max=5)
    assert s["front90"] == 5  # 2 and 4 pass, first OOD (6) fails → train_max
    assert s["oracle_id"] == pytest.approx(1.0)


def test_summarize_flip_rate_from_a_later_k():
    s = summarize(synthetic_outcomes(), train_max=4, flip_from=2)
    assert s["flip_rate"] == pytest.approx(3 / 8) and s["flip_range"] == [2, 2]
    assert s["counts"]["flip_pairs"] == 8
    assert s["per_length"]["6"]["flip_rate"] == pytest.approx(2 / 4)  # ood6 column 1: 1 0 0 1


def test_summarize_without_ood_lengths_is_undefined_not_zero():
    s = summarize(synthetic_outcomes()[:2], train_max=4)
    assert s["oracle_ood"] is None and s["policy_ood"] is None and s["gap"] is None
    assert s["oracle_id"] == pytest.approx(0.875)
    # no OOD sample: the flip rate and its curve are undefined, not the ID rows' 0
    assert s["flip_rate"] is None and s["flip_curve"] == [None, None]
    assert s["counts"]["ood_lengths"] == 0 and s["counts"]["flip_pairs"] == 0
    assert all(s["exits"][name]["policy_ood"] is None for name in s["exits"])


def test_summarize_one_loop_has_no_flip_rate():
    outcomes = [LengthOutcome(n, _b([[1], [0]]), np.zeros((2, 0), dtype=bool), np.array([1, 1])) for n in (2, 6)]
    s = summarize(outcomes, train_max=4)
    assert s["flip_rate"] is None and s["flip_curve"] == [] and s["flip_range"] == [1, 0]
    assert s["per_length"]["6"]["flip_rate"] is None


def test_grid_frame():
    frame = grid_frame(synthetic_outcomes(), train_max=4)
    assert list(frame.columns) == ["length", "loops", "accuracy", "flip_rate", "split"]
    assert len(frame) == 4 * 3
    row = frame[(frame.length == 8) & (frame.loops == 2)].iloc[0]
    assert row.accuracy == pytest.approx(0.75) and row.split == "ood"
    assert row.flip_rate == pytest.approx(0.25)  # column 1 of ood8's flips: 1, 0, 0, 0
    assert frame[(frame.length == 6) & (frame.loops == 1)].flip_rate.iloc[0] == pytest.approx(0.5)
    assert math.isnan(frame[(frame.length == 6) & (frame.loops == 3)].flip_rate.iloc[0])
    assert set(frame[frame.length <= 4].split) == {"id"}
    assert sorted(frame.loops.unique().tolist()) == [1, 2, 3]


def test_training_cost_without_a_logged_step_is_undefined(tmp_path):
    from looplab.eval.run import training_cost

    assert training_cost(tmp_path) == {"block_evals": None, "row_loops_mean": None}
    (tmp_path / "log.jsonl").write_text('{"step": 1, "block_evals": 6.0, "row_loops_mean": 3.0}\n')
    assert training_cost(tmp_path) == {"block_evals": 6.0, "row_loops_mean": 3.0}


def test_relative_drop_from_a_zero_peak_is_undefined():
    import pandas as pd

    from looplab.eval.scaling import scaling_summary

    frame = pd.DataFrame({"loops": [1, 2, 3], "accuracy": [0.0, 0.0, 0.0], "nonfinite_fraction": [0.0] * 3})
    assert scaling_summary(frame)["relative_drop"] is None
    frame["accuracy"] = [0.5, 1.0, 0.25]
    assert scaling_summary(frame)["relative_drop"] == pytest.approx(0.75)
