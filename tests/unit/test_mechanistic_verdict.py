"""The rule that marks a norm-ablation row reproduced, partly or not."""

from __future__ import annotations

import pytest

from looplab.studies.mechanistic.paper import mechanistic_verdict, meets


@pytest.mark.parametrize(
    "ours, printed, expected",
    [
        (0.995, 1.0, True),
        (0.99, "1.000", True),
        (0.985, 1.0, False),
        (0.50, "<0.65", True),
        (0.65, "<0.65", False),
        (0.82, "<0.80", False),
        (-0.3, "<0.85", True),
        (0.91, 0.92, True),
        (0.875, "0.920", True),
        (0.86, 0.92, False),
        (0.925, 0.88, True),
        (0.94, 0.88, False),
        (None, 1.0, False),
        (float("nan"), "<0.65", False),
        (0.5, None, False),
    ],
)
def test_meets(ours, printed, expected):
    assert meets(ours, printed) is expected


def row(self_median, cross, paper_self, paper_cross):
    return {
        "ours.analysis.fixed_point_self_cos_median": self_median,
        "ours.min_cos_first_layer_to_other_layers_fixed_point": cross,
        "paper.cos_first_layer_to_own_fixed_point": paper_self,
        "paper.min_cos_first_layer_to_other_layers_fixed_point": paper_cross,
    }


@pytest.mark.parametrize(
    "values, verdict",
    [
        (row(1.0, 0.5, 1.0, "<0.65"), "reproduced"),
        (row(1.0, 0.82, 1.0, "<0.80"), "partly"),
        (row(0.996, 1.0, "<0.75", "<0.60"), "not reproduced"),
        (row(0.905, 0.917, 0.92, 0.88), "reproduced"),
    ],
)
def test_verdict(values, verdict):
    assert mechanistic_verdict(values) == verdict
