"""The stars-finetune study's decision rules and blocks (looplab/studies/stars/finetune.py)."""

import numpy as np
import pandas as pd
import pytest

from looplab.studies.stars.finetune import (
    CURVE_COLUMNS,
    READ_LOOPS,
    arm_name,
    decision_lines,
    exact_match_block,
    loss_line,
    rho_line,
)


def _runs(em32: dict[str, list[float]], placement: str = "post_sandwich", extra: dict | None = None) -> pd.DataFrame:
    """Rows of runs.csv: exact match ``em32`` per arm at 8, 32 and 64 loops; ``extra`` {arm: {column: values}}."""
    rows = []
    for arm, values in em32.items():
        for seed, value in enumerate(values):
            row = {"placement": placement, "arm": arm, "seed": 600 + seed, "status": "done", "step_s": 0.1}
            row.update({f"{name}_{k}": np.nan for name in CURVE_COLUMNS.values() for k in READ_LOOPS})
            row.update({"em_32": value, "em_8": value, "em_64": value})
            row.update({key: v[seed] for key, v in (extra or {}).get(arm, {}).items()})
            rows.append(row)
    return pd.DataFrame(rows)


def _line(lines, start):
    return next(line for line in lines if line.startswith(start))


@pytest.mark.parametrize(
    "stars, lognormal, verdict",
    [
        ([0.6, 0.62, 0.61, 0.63, 0.6], [0.4, 0.42, 0.41, 0.39, 0.4], "adds"),
        ([0.4, 0.42, 0.41, 0.39, 0.4], [0.6, 0.62, 0.61, 0.63, 0.6], "hurts"),
        ([0.5, 0.7, 0.3, 0.6, 0.4], [0.45, 0.65, 0.35, 0.55, 0.5], "not resolved"),
    ],
)
def test_jsrr_with_random_loops_reads_exact_match_at_32_loops(stars, lognormal, verdict):
    lines = decision_lines(_runs({"stars": stars, "lognormal": lognormal}))
    line = _line(lines, "JSRR with random loops")
    assert "exact match at 32 loops" in line and line.endswith(verdict)
    assert "n/a" in _line(lines, "JSRR alone")  # no fixed4 arms here: undefined, not 0


@pytest.mark.parametrize(
    "rho, verdict",
    [
        ([0.9, 0.92, 0.91, 0.93, 0.9], "below 1"),
        ([1.1, 1.12, 1.11, 1.13, 1.1], "above 1"),
        ([0.9, 1.1, 0.95, 1.05, 1.0], "not resolved"),
    ],
)
def test_rho_is_judged_against_one_by_its_t_interval(rho, verdict):
    line = rho_line("stars", 4, np.array(rho))
    assert line.endswith(verdict) and f"{sum(r < 1 for r in rho)} of 5 seeds below 1" in line
    assert "n/a" in rho_line("stars", 4, np.array([0.9]))


def test_placement_compares_the_same_arm_across_placements_and_loss_the_right_way_round():
    post = _runs({"stars": [0.8, 0.82, 0.81, 0.83, 0.8]}, extra={"stars": {"loss_64": [2.0, 2.01, 2.02, 2.0, 2.01]}})
    pre = _runs(
        {"stars": [0.4, 0.42, 0.41, 0.43, 0.4]}, "pre_sandwich", {"stars": {"loss_64": [3.0, 3.01, 3.02, 3.0, 3.01]}}
    )
    lines = decision_lines(pd.concat([post, pre]))
    assert _line(lines, "placement, stars: post − pre").endswith("post holds more")
    # pre's higher loss means post-sandwich predicts better
    assert _line(lines, "placement, stars: pre − post, KJV loss").endswith("post holds more")
    assert "n/a" in loss_line("q", np.array([3.0]), np.array([2.0, 2.1]), 64)


def test_pretrained_runs_are_named_by_their_shape():
    plain = pd.Series({"model.prelude_layers": 0, "model.injection": "none"})
    assert arm_name("pretrain", plain) == "pretrain"
    assert arm_name("pretrain+model.injection=contractive", plain.replace("none", "contractive")) == (
        "pretrain (contractive)"
    )
    assert arm_name("pretrain+model.prelude_layers=1", pd.Series({"model.prelude_layers": 1})) == (
        "pretrain (prelude_coda)"
    )
    assert arm_name("post_sandwich-fixed4_jsrr", plain) == "fixed4_jsrr"


def test_the_exact_match_block_ranks_arms_at_32_loops_and_shows_missing_values_as_na(tmp_path):
    runs = _runs({"lognormal": [0.4, 0.41, 0.42], "stars": [0.6, 0.61, 0.62], "pretrain": [0.9, 0.9, 0.91]})
    (tmp_path / "stars-finetune").mkdir()
    runs.to_csv(tmp_path / "stars-finetune" / "runs.csv", index=False)
    block = exact_match_block(tmp_path)
    arms = [line.split("|")[2].strip() for line in block.splitlines()[2:]]
    assert arms == ["stars", "lognormal", "pretrain"]  # by exact match at 32 loops, pretrained runs last
    assert "n/a (0 seeds)" in block  # em at 4 loops was never measured here


def test_rho_intervals_are_clipped_at_zero():
    line = rho_line("stars", 32, np.array([0.01, 0.9, 0.02, 0.85, 0.03]))  # a t-interval reaching below 0
    low = float(line.split("[")[1].split(",")[0])
    assert low == 0.0 and line.endswith("below 1")


def _committed(tmp_path, runs: pd.DataFrame):
    (tmp_path / "stars-finetune").mkdir()
    runs.to_csv(tmp_path / "stars-finetune" / "runs.csv", index=False)
    return tmp_path


def test_every_decision_line_is_said_with_nothing_added_and_nothing_left_out():
    from pathlib import Path

    from looplab.studies.prose import said, split_decision

    runs = pd.read_csv(Path(__file__).resolve().parents[2] / "docs" / "results" / "stars-finetune" / "runs.csv")
    for line in decision_lines(runs):
        question, evidence, verdict = split_decision(line)
        assert f"{question}: {evidence}: {verdict}" == line
        assert said(line) == f"**{question[0].upper()}{question[1:]}: {verdict}.** {evidence}."


def test_the_rho_sentence_groups_arms_by_their_verdict_and_names_every_arm(tmp_path):
    from looplab.studies.stars.finetune import says_rho

    rho = {
        "stars": [1.1, 1.12, 1.11, 1.13, 1.1],
        "lognormal": [1.2, 1.22, 1.21, 1.23, 1.2],
        "frobenius": [1.05, 1.06, 1.04, 1.05, 1.07],
        "contractive": [0.9, 0.92, 0.91, 0.93, 0.9],
        "state_l2": [0.9, 1.1, 0.95, 1.05, 1.0],
    }
    extra = {arm: {"rho_4": v, "rho_32": v} for arm, v in rho.items()}
    text = says_rho(_committed(tmp_path, _runs({arm: [0.5] * 5 for arm in rho}, extra=extra)))
    first = text.split(" ρ at 32")[0]
    assert "**below 1** for contractive at 0.912, 95% [0.896, 0.928] (5 of 5 seeds below 1)" in first
    assert "**not resolved** for state_l2 at 1.000" in first
    assert "**above 1** for 3 (lognormal, stars and frobenius; seed means 1.054–1.212)" in first


def test_the_state_norm_sentence_reads_both_placements(tmp_path):
    from looplab.studies.stars.finetune import says_state_norm

    post = _runs({"stars": [0.5] * 3, "state_l2": [0.5] * 3}, extra={
        "stars": {"norm_128": [8.0, 8.1, 8.05]}, "state_l2": {"norm_128": [7.8, 7.85, 7.9]}})  # fmt: skip
    pre = _runs({"stars": [0.5] * 3}, "pre_sandwich", {"stars": {"norm_128": [1700.0, 1750.0, 1800.0]}})
    text = says_state_norm(_committed(tmp_path, pd.concat([post, pre])))
    assert "post-sandwich arms 7.85–8.05" in text and "the lowest state_l2's" in text
    assert "pre-sandwich arms 1750 (1 arms)" in text


def _decision(verdict: str) -> str:
    return f"q: a − b, exact match at 32 loops +1.0 pp, Welch 95% [+0.1, +2.0] (5 vs 5 seeds): {verdict}"


def test_holm_over_a_hand_computed_case():
    from looplab.studies.stars.verdicts import decided

    # m = 4, p sorted 0.01 < 0.02 < 0.04 < 0.30: adjusted 4·0.01 = 0.04, max(0.04, 3·0.02) = 0.06,
    # max(0.06, 2·0.04) = 0.08, max(0.08, 1·0.30) = 0.30; only the first stays below 0.05
    found = decided([(_decision("adds"), 0.02), (_decision("adds"), 0.01), (_decision("hurts"), 0.04),
                     (_decision("not resolved"), 0.30)])  # fmt: skip
    assert [round(d.holm_p, 10) for d in found] == [0.06, 0.04, 0.08, 0.30]
    assert [d.holm_verdict for d in found] == ["not resolved", "adds", "not resolved", "not resolved"]


def test_a_p_value_that_decides_unlike_its_rule_is_refused():
    from looplab.studies.stars.verdicts import decided

    with pytest.raises(ValueError, match="decides unlike the rule"):
        decided([(_decision("not resolved"), 0.01)])
    with pytest.raises(ValueError, match="decides unlike the rule"):
        decided([(_decision("adds"), 0.2)])


def test_the_p_values_decide_as_the_rules_do_on_random_seeds():
    from looplab.report.effect import ALPHA, comparison_line
    from looplab.studies.prose import verdict_of
    from looplab.studies.stars.verdicts import direction_p, mean_p

    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b = rng.normal(0.5, 0.1, 5), rng.normal(0.5 + rng.normal(0, 0.1), rng.uniform(0.01, 0.2), 5)
        line = comparison_line("q", "a", "b", a, b, "exact match", "adds", "hurts")
        assert (direction_p(a, b) < ALPHA) == (verdict_of(line) != "not resolved")
        rho = rng.normal(1 + rng.normal(0, 0.05), 0.05, 5)
        assert (mean_p(rho, 1.0) < ALPHA) == (verdict_of(rho_line("arm", 4, rho)) != "not resolved")


def test_the_committed_decisions_and_their_holm_table():
    from pathlib import Path

    from looplab.studies.stars.finetune import decisions, holm_table_block
    from looplab.studies.stars.verdicts import decided

    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    found = decided(decisions(pd.read_csv(results / "stars-finetune" / "runs.csv")))  # raises on a mismatch
    assert len(found) == 29
    block = holm_table_block(results)
    assert block.count("\n| ") == 29 and "29 decisions: " in block  # one row per decision
