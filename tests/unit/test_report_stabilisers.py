"""The stabilisers study's decision rules and page blocks (looplab/studies/stars/stabilisers.py)."""

import pandas as pd
import pytest

from looplab.studies.stars.stabilisers import accuracy_block, cost_block, decision_lines


def _runs(arms: dict[str, list[float]]) -> pd.DataFrame:
    rows = []
    for arm, values in arms.items():
        for seed, value in enumerate(values):
            rows.append({"arm": arm, "seed": 500 + seed, "status": "done", "acc_256": value, "step_s": 0.04})
    return pd.DataFrame(rows)


def _line(lines, start):
    return next(line for line in lines if line.startswith(start))


@pytest.mark.parametrize(
    "stars, lognormal, verdict",
    [
        ([0.9, 0.92, 0.88, 0.91, 0.9], [0.5, 0.52, 0.48, 0.51, 0.5], "adds"),
        ([0.5, 0.52, 0.48, 0.51, 0.5], [0.9, 0.92, 0.88, 0.91, 0.9], "hurts"),
        ([0.9, 0.5, 0.7, 0.8, 0.6], [0.8, 0.6, 0.7, 0.75, 0.65], "not resolved"),
    ],
)
def test_jsrr_with_random_loops_follows_the_welch_interval(stars, lognormal, verdict):
    line = _line(decision_lines(_runs({"stars": stars, "lognormal": lognormal})), "JSRR with random loops")
    assert line.endswith(verdict) and "(5 vs 5 seeds)" in line


def test_a_missing_arm_is_undefined_and_every_stabiliser_is_judged_against_stars():
    lines = decision_lines(_runs({"stars": [0.9, 0.8], "contractive": [1.0, 1.0, 1.0]}))
    assert "fixed4-jsrr vs fixed4: n/a (0 and 0 seeds" in _line(lines, "JSRR alone")
    assert _line(lines, "stabiliser: contractive − stars").endswith("not resolved")  # two stars seeds: wide
    assert [line.split(":")[1].split()[0] for line in lines if line.startswith("stabiliser")] == [
        "frobenius",
        "state_l2",
        "prelude_coda",
        "contractive",
    ]


def test_the_blocks_rank_arms_and_show_unmeasured_rho_as_na(tmp_path):
    runs = _runs({"stars": [0.9, 0.8, 0.85], "lognormal": [0.2, 0.3, 0.25]})
    for k in (4, 8, 16, 32, 64, 128):
        runs[f"acc_{k}"] = runs["acc_256"]
    runs["acc_min_4_256"] = runs["acc_256"]
    runs.loc[runs.arm == "stars", "step_s"] = 0.08
    (tmp_path / "stars-stabilisers").mkdir()
    runs.to_csv(tmp_path / "stars-stabilisers" / "runs.csv", index=False)
    table = accuracy_block(tmp_path).splitlines()
    assert table[2].startswith("| stars | 3 |") and table[3].startswith("| lognormal | 3 |")
    cost = cost_block(tmp_path)
    assert "| stars | 0.080 | 2.00x |" in cost and "n/a (0 seeds)" in cost


def test_holm_over_the_six_decisions_against_a_hand_computed_case():
    from looplab.studies.stars.stabilisers import decisions
    from looplab.studies.stars.verdicts import decided, direction_p

    strong = [0.9, 0.92, 0.88, 0.91, 0.9]
    arms = {"stars": [0.5, 0.52, 0.48, 0.51, 0.5], "lognormal": strong, "fixed4-jsrr": [0.7, 0.5, 0.8, 0.6, 0.75],
            "fixed4": [0.5, 0.45, 0.6, 0.55, 0.5], "contractive": strong}  # fmt: skip
    found = decided(decisions(_runs(arms)))  # raises when a p-value decides unlike its rule
    assert len(found) == 6
    p = {d.line.split(":")[1].split(",")[0].strip(): d.p for d in found}
    assert p["stars − lognormal"] == pytest.approx(direction_p(arms["stars"], arms["lognormal"]))
    # the four stabilisers with no frobenius / state_l2 / prelude_coda rows are n/a: p counts as 1
    defined = sorted(v for v in p.values() if v == v)
    assert len(defined) == 3
    # Holm by hand over m = 6: the k-th smallest p times (6 − k + 1), running maximum, capped at 1
    by_hand, running = [], 0.0
    for k, value in enumerate(defined):
        running = max(running, min(1.0, (6 - k) * value))
        by_hand.append(running)
    assert sorted(d.holm_p for d in found if d.p == d.p) == pytest.approx(by_hand)
    assert all(d.holm_p == 1.0 and d.verdict.startswith("n/a") for d in found if d.p != d.p)
    for d in found:
        assert d.holm_verdict == (d.verdict if d.holm_p < 0.05 or not d.resolved else "not resolved")


def test_the_committed_decisions_decide_as_their_p_values_and_holm_keeps_them():
    from pathlib import Path

    from looplab.studies.stars.stabilisers import decisions, holm_table_block
    from looplab.studies.stars.verdicts import decided

    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    found = decided(decisions(pd.read_csv(results / "stars-stabilisers" / "runs.csv")))
    assert [d.verdict for d in found] == [d.holm_verdict for d in found]
    assert "6 decisions: 2 name a direction by the rule, 2 after Holm" in holm_table_block(results)
