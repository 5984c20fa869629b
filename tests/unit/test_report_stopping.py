"""The stopping comparison's rules: where a paper value lies against our interval, the conclusion rule,
and the effect test of the stopping study."""

import math

import pandas as pd
import pytest


@pytest.mark.parametrize(
    "value, low, high, where",
    [
        (5.0, 1.0, 4.0, "above"),
        (0.5, 1.0, 4.0, "below"),
        (1.0, 1.0, 4.0, "inside"),
        (4.0, 1.0, 4.0, "inside"),
        ("<0.65", 1.0, 4.0, "–"),
        (2.0, math.nan, 4.0, "–"),
        (None, 1.0, 4.0, "–"),
    ],
)
def test_where_a_paper_value_lies_against_our_interval(value, low, high, where):
    from looplab.report.comparison import place

    assert place(value, low, high) == where


def test_effect_test_follows_its_stated_rule():
    from looplab.studies.stopping.paper import effect_tests

    def rows(variant, oods, gaps):
        return pd.DataFrame({"task.name": "binary_addition", "variant": variant, "oracle_ood": oods, "gap": gaps})

    spread = rows("fixed", [0.1, 0.5, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4], [0.3, 0.2, 0.35, 0.25, 0.3, 0.28, 0.32, 0.22])
    steady = rows("window", [0.50, 0.51, 0.49, 0.50, 0.52, 0.48, 0.50, 0.51], [0.01] * 8)
    (line,) = effect_tests(pd.concat([spread, steady]))
    assert line.startswith("Effect test, binary_addition, fixed vs window (8 and 8 seeds") and line.endswith(
        ": reproduced."
    )
    (same,) = effect_tests(pd.concat([spread, rows("window", spread["oracle_ood"], spread["gap"])]))
    assert same.endswith(": not reproduced.")
    assert effect_tests(spread) == []  # nothing to compare with


def test_halting_table_counts_runs_that_halt_before_half_of_the_natural_depth():
    from looplab.studies.stopping.halting import SHALLOW, halting_table

    def run(variant, depth_at_4, depth_at_8, entropy):
        # dyck1's natural depth T(n) is n; n = 4 and 8 are training lengths, n = 16 is not
        return {
            "task.name": "dyck1",
            "task.alphabet": 8,
            "variant": variant,
            "oracle_ood": 0.4,
            "per_length.4.split": "id",
            "per_length.8.split": "id",
            "per_length.16.split": "ood",
            "halting.4.mean_depth": depth_at_4,
            "halting.8.mean_depth": depth_at_8,
            "halting.16.mean_depth": 1.0,  # OOD lengths never count
            "halting.4.entropy": entropy,
            "halting.8.entropy": entropy,
            "halting.16.entropy": 0.0,
        }

    results = pd.DataFrame(
        [
            run("rl_halting", 4.0, 8.0, 1.0),
            run("rl_halting", 4.4, 8.8, 1.2),
            run("rl_halting-ent0", 1.0, 1.0, 0.01),  # (0.25 + 0.125) / 2 < SHALLOW
            run("rl_halting-ent0", 3.0, 6.0, 0.5),  # 0.75: not collapsed
            {"task.name": "dyck1", "task.alphabet": 8, "variant": "fixed", "oracle_ood": 0.3},
        ]
    )
    table = halting_table(results)
    numbers = table.numbers.set_index("variant")
    assert list(numbers.index) == ["rl_halting", "rl_halting-ent0"]  # no halting head, no row
    assert numbers.loc["rl_halting", "collapsed"] == 0 and numbers.loc["rl_halting-ent0", "collapsed"] == 1
    assert numbers.loc["rl_halting", "depth_ratio.mean"] == pytest.approx(1.05)
    assert numbers.loc["rl_halting-ent0", "depth_ratio.mean"] == pytest.approx((0.1875 + 0.75) / 2)
    assert SHALLOW == 0.5 and "1 / 2" in set(table.display["Collapsed"])
    assert halting_table(results[results["variant"] == "fixed"]) is None
