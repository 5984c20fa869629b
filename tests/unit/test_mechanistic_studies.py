"""The mechanistic studies' derived measures and decisions, on rows whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from looplab.studies.mechanistic.grid import point_table, seed_verdicts, wilson
from looplab.studies.mechanistic.trained import decision_lines, stage_table

FEEDFORWARD = [0.1, 0.1, 0.1, 0.1, 0.8, 0.8, 0.8, 0.8, 0.6, 0.6, 0.6, 0.6, 0.2, 0.2, 0.2, 0.2]


def layer_rows(arm, seed, curves, condition="base"):
    return [
        {"arm": arm, "seed": seed, "condition": condition, "loop": t + 1, "layer": layer, "colsum": value}
        for t, curve in enumerate(curves)
        for layer, value in enumerate(curve)
    ]


def study_rows():
    rows, rng = [], np.random.default_rng(0)
    for seed in (0, 1, 2):
        rows += layer_rows("feedforward", seed, [np.array(FEEDFORWARD) + 0.01 * rng.standard_normal(16)])
        stages = [[0.1, 0.8, 0.6, 0.2] + 0.01 * rng.standard_normal(4) for _ in range(4)]
        rows += layer_rows("looped", seed, stages)
        rows += layer_rows("looped", seed, [0.1 * np.array(c) for c in stages], "zero_massive")
        rows += layer_rows("looped-sandwich", seed, [[0.3, 0.31, 0.3, 0.29 + 0.01 * seed]] * 4)
    return pd.DataFrame(rows)


def test_stage_alignment_and_amplitude_of_known_curves():
    table = stage_table(study_rows()).set_index(["arm", "seed"])
    assert (table.loc["looped", "alignment"] > 0.99).all()
    assert table.loc["looped", "amplitude"].to_numpy() == pytest.approx([0.7] * 3, abs=0.05)
    # a feed-forward seed is held against the mean of the other two
    assert (table.loc["feedforward", "alignment"] > 0.99).all()
    assert (table.loc["looped-sandwich", "amplitude"] < 0.05).all()
    zeroed = stage_table(study_rows(), "zero_massive").set_index(["arm", "seed"])
    assert zeroed.loc["looped", "amplitude"].to_numpy() == pytest.approx(0.1 * table.loc["looped", "amplitude"])


def test_the_four_decisions_read_as_the_protocol_says():
    runs = pd.DataFrame(
        [{"arm": "looped", "seed": s, "status": "done", "delta_128": 1e-6 * (1 + s)} for s in range(3)]
        + [{"arm": "looped-noinject", "seed": s, "status": "done", "delta_128": 0.1 * (1 + s)} for s in range(3)]
    )
    lines = decision_lines(study_rows(), runs)
    assert lines[0].startswith("Stages repeat") and lines[0].endswith(": holds")
    assert "after / before zeroing the largest MLP 0.100" in lines[1] and lines[1].endswith(": holds")
    assert lines[2].endswith(": holds") and "(few seeds: 3)" in lines[2]
    assert lines[3].endswith(": holds")


def test_decisions_without_seeds_are_not_available():
    rows = study_rows()
    lines = decision_lines(
        rows[rows.arm == "feedforward"], pd.DataFrame(columns=["arm", "seed", "status", "delta_128"])
    )
    assert lines[0].endswith("n/a (0 seeds; needs 2)")
    assert "n/a (0 and 0 seeds; needs 2 each)" in lines[3]


def grid_rows(placement, injection, cosines):
    return [
        {
            "placement": placement,
            "injection": injection,
            "init_std": 0.4,
            "embed_std": 1.0,
            "inject_gain": gain,
            "seed": seed,
            "self_cos_median": self_cos,
            "cross_cos_min": cross,
        }
        for gain in (0.125, 0.25)
        for seed, (self_cos, cross) in enumerate(cosines)
    ]


def test_grid_points_hold_by_two_of_three_seeds_and_rows_without_injection_merge():
    runs = pd.DataFrame(
        # pre / injection, paper: 1.000 and <0.65 — two seeds meet both, one only the first
        grid_rows("pre", "concat", [(0.999, 0.5), (0.995, 0.6), (0.999, 0.9)])
        # pre / none, paper: 1.000 and 1.000 — one seed meets both
        + grid_rows("pre", "none", [(0.999, 0.999), (0.5, 0.999), (0.5, 0.5)])
    )
    assert seed_verdicts(runs).met.tolist()[:3] == [2, 2, 1]
    points = point_table(runs).set_index(["placement", "injection"])
    assert points.loc[("pre", "concat")].holds.tolist() == [True, True]  # one point per gain
    none = points.loc[[("pre", "none")]]
    assert len(none) == 1 and int(none.seeds.iloc[0]) == 3  # the gain does not enter a model without W_I
    assert not none.holds.iloc[0] and none.partly_holds.iloc[0]


def test_wilson_interval():
    low, high = wilson(27, 27)
    assert high == 1.0 and low == pytest.approx(0.8754, abs=1e-3)
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_retrofit_mlp_names_map_to_llama_layers():
    from looplab.studies.mechanistic.smollm2_stages import llama_layer, retrofit_name

    shape, layers = (4, 6, 4), 30
    assert [retrofit_name(i, shape, layers) for i in (2, 4, 9, 10, 25, 26, 29)] == [
        "prelude2",
        "core0",
        "core5",
        None,
        None,
        "coda0",
        "coda3",
    ]
    for layer in (0, 3, 4, 9, 26, 29):
        assert llama_layer(retrofit_name(layer, shape, layers), shape, layers) == layer


def test_the_trained_studys_p_values_decide_as_its_rules_and_holm_keeps_both_verdicts():
    """On the committed CSVs: each decision's p is below α exactly when its rule resolves it, the adjusted p is
    Holm's step-down of the four by hand, and Holm keeps rule 2's and rule 4's "fails"."""
    from pathlib import Path

    import numpy as np

    from looplab.report.effect import ALPHA
    from looplab.studies.mechanistic.verdicts import decisions

    found = decisions(Path(__file__).parents[2] / "docs" / "results")
    assert [d.verdict for d in found] == ["not resolved", "fails", "not resolved", "fails"]
    assert all((d.p < ALPHA) == (d.verdict != "not resolved") for d in found)
    p = np.array([d.p for d in found])
    order = np.argsort(p, kind="stable")
    by_hand = np.maximum.accumulate(np.minimum(1.0, (4 - np.arange(4)) * p[order]))
    assert np.allclose(np.array([d.holm_p for d in found])[order], by_hand)
    assert [d.holm_verdict for d in found] == [d.verdict for d in found]
