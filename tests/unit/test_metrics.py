"""Paper-1 metrics (docs/methods.md §5) on hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from looplab.eval.grid import LengthOutcome, grid_frame
from looplab.eval.metrics import flip_rate_after_policy, front_at, summarize

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
    assert front_at({4: 0.2, 8: 1.0, 12: 1.0}, train_max=10) == 0


def test_front_passes_with_a_gap_later():
    # 20 passes again but 16 failed: the front stops at 12
    assert front_at({4: 1.0, 8: 1.0, 12: 1.0, 16: 0.2, 20: 1.0}, train_max=8) == 12


def test_front_ignores_dict_order():
    assert front_at({16: 0.2, 4: 1.0, 12: 1.0, 8: 1.0}, train_max=8) == 12


# ----------------------------------------------------------------------------- flip rate


def test_flip_rate_after_policy_by_hand():
    flips = np.array([[1, 0, 1, 0], [0, 0, 0, 1]], dtype=bool)  # T = 5; column K-1 is K → K+1
    # row 0 from K = 2: columns 1..3 → 0, 1, 0 → 1/3; row 1 from K = 5: no column → left out
    assert flip_rate_after_policy(flips, np.array([2, 5])) == pytest.approx(1 / 3)
    # row 0 from K = 1: 2/4; row 1 from K = 4: 1/1 → mean 0.75
    assert flip_rate_after_policy(flips, np.array([1, 4])) == pytest.approx(0.75)
    # row 0 from K = 4: 0/1; row 1 from K = 3: 1/2 → 0.25
    assert flip_rate_after_policy(flips, np.array([4, 3])) == pytest.approx(0.25)


def test_flip_rate_degenerate():
    assert flip_rate_after_policy(np.zeros((3, 0), dtype=bool), np.array([1, 1, 1])) == 0.0
    assert flip_rate_after_policy(np.ones((2, 2), dtype=bool), np.array([3, 3])) == 0.0


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
    # flips over OOD rows: ood6 rows all have policy 3 (> T-1) and drop out;
    # ood8: row 0 from K=1 → 2/2, row 1 from K=2 → 0/1 → mean .5
    assert s["flip_rate"] == pytest.approx(0.5)
    # curve over the 8 OOD rows: column 0 → 0+1+0+1 + 1+0+0+1 = 4/8; column 1 → 1+0+0+1 + 1+0+0+0 = 3/8
    assert s["flip_curve"] == pytest.approx([0.5, 0.375])

    per = s["per_length"]
    assert set(per) == {"2", "4", "6", "8"}
    assert per["2"] == pytest.approx(
        {"split": "id", "oracle": 1.0, "best_k": 2, "policy": 1.0, "policy_depth": 2.0, "flip_rate": 0.0}
    )
    assert per["4"]["best_k"] == 3 and per["4"]["oracle"] == pytest.approx(0.75)
    assert per["6"]["split"] == "ood" and per["6"]["best_k"] == 1  # first of the tied maxima
    assert per["6"]["flip_rate"] == 0.0
    assert per["8"]["policy_depth"] == pytest.approx(2.25)
    assert per["8"]["flip_rate"] == pytest.approx(0.5)
    assert per["8"]["best_k"] == 2


def test_summarize_front_when_first_ood_fails():
    outcomes = synthetic_outcomes()
    outcomes[1] = LengthOutcome(4, _b([[1, 1, 1]] * 4), _b([[0, 0]] * 4), np.array([3, 3, 3, 3]))
    s = summarize(outcomes, train_max=5)
    assert s["front90"] == 5  # 2 and 4 pass, first OOD (6) fails → train_max
    assert s["oracle_id"] == pytest.approx(1.0)


def test_summarize_without_ood_lengths():
    s = summarize(synthetic_outcomes()[:2], train_max=4)
    assert s["oracle_ood"] is None and s["policy_ood"] is None and s["gap"] is None
    assert s["oracle_id"] == pytest.approx(0.875)
    assert s["flip_rate"] == 0.0  # falls back to all (ID) rows, which never flip
    assert s["flip_curve"] == [0.0, 0.0]


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
