"""The retrofit comparison's collector and page blocks, on run folders whose answers are known."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from looplab.studies.stars.retrofit import collect, decision_block, means_block, runs_block, search_block

LOOPS = np.arange(1, 17)


def write_run(root, part, recipe, seed, at_4, at_8, learned_at=None):
    folder = root / part / "retrofit" / f"{recipe}-seed{seed}"
    folder.mkdir(parents=True)
    em = np.where(LOOPS < 4, at_4 / 2, np.where(LOOPS < 8, at_4, at_8))
    pd.DataFrame(
        {
            "loops": LOOPS,
            "loss": 5 + LOOPS / 10,
            "reasoning_id": em,
            "reasoning_ood": em / 2,
            "state_norm": 1.0,
            "spectral_radius": 0.9 + LOOPS / 100,
        }
    ).to_csv(folder / "loops.csv", index=False)
    steps = [0, 50, 100]
    accuracy = [0.0, 0.5, 0.95] if learned_at == 100 else [0.0, 0.3, 0.6]
    pd.DataFrame(
        {"step": steps, "elapsed_s": [1, 60, 120], "accuracy": accuracy, "problems": 64, "kjv_loss": [10, 12, 14]}
    ).to_csv(folder / "curve.csv", index=False)
    study = {"steps": 100, "lr": 3e-4}
    (folder / "summary.json").write_text(json.dumps({"recipe": recipe, "seed": seed, "wall_s": 600, "study": study}))


@pytest.fixture
def results(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "retrofit-learned", "fixed", 1, 0.9, 0.45, learned_at=100)  # drop 50 %
    write_run(runs, "retrofit-learned", "fixed", 2, 1.0, 0.6, learned_at=100)  # drop 40 %
    write_run(runs, "retrofit-learned", "stars", 1, 0.8, 0.72)  # drop 10 %
    write_run(runs, "retrofit-learned", "stars", 2, 1.0, 1.0)  # drop 0 %
    write_run(runs, "retrofit-budget-problems", "fixed", 91, 0.95, 0.9, learned_at=100)
    out = tmp_path / "docs" / "stars-retrofit"
    collect([runs / "retrofit-learned", runs / "retrofit-budget-problems"], out)
    return tmp_path / "docs"


def test_the_collector_reads_each_run_and_the_drop_it_defines(results):
    runs = pd.read_csv(results / "stars-retrofit" / "runs.csv")
    assert list(runs.part) == ["retrofit-budget-problems"] + ["retrofit-learned"] * 4
    learned = runs[runs.part == "retrofit-learned"].set_index(["recipe", "seed"])
    assert learned.drop_4_8.to_dict() == pytest.approx(
        {("fixed", 1): 0.5, ("fixed", 2): 0.4, ("stars", 1): 0.1, ("stars", 2): 0.0}
    )
    assert learned.loc[("fixed", 1), "learned_step"] == 100 and np.isnan(learned.loc[("stars", 1), "learned_step"])
    assert learned.loc[("fixed", 1), "rho_4"] == pytest.approx(0.94)
    curves = pd.read_csv(results / "stars-retrofit" / "curves.csv")
    assert len(curves) == 15 and set(curves.part) == {"retrofit-learned", "retrofit-budget-problems"}


def test_two_seeds_are_inconclusive_whatever_the_interval(results):
    line = decision_block(results)
    assert line.startswith("- relative drop 4 → 8 loops, fixed − stars: +40.0 pp, Welch 95% [")
    assert "(2 vs 2 seeds): inconclusive (2 seeds; by the interval alone: " in line


def test_the_blocks_show_every_run_and_only_the_search_in_the_search(results):
    table = runs_block(results)
    assert table.count("\n| fixed |") == 2 and table.count("\n| stars |") == 2
    assert "| never |" in table and "| 100 |" in table
    assert "retrofit-budget-problems seed 91" in search_block(results)
    assert "retrofit-learned" not in search_block(results)
    means = means_block(results)
    assert "| fixed | 2 | 95.0 ± 7.1" in means


def test_a_drop_lies_between_one_minus_one_over_its_accuracy_at_4_loops_and_one():
    from looplab.studies.stars.retrofit import drop_range

    assert drop_range([0.5, 1.0]) == pytest.approx((-0.5, 1.0))  # at 4 loops 50 %: at best 100 % at 8, drop −100 %


def test_an_interval_wider_than_the_drops_allow_is_clipped_and_the_verdict_read_as_frozen():
    from looplab.studies.stars.retrofit import decision_line

    runs = pd.DataFrame(
        {
            "recipe": ["fixed", "fixed", "stars", "stars"],
            "em_4": [0.9, 0.5, 0.8, 1.0],
            "drop_4_8": [0.8, 0.1, 0.0, -0.05],
        }
    )
    line = decision_line(runs)
    # fixed's mean drop ≥ mean(1 − 1/0.9, 1 − 1/0.5) = −0.556; stars' ≤ 1: the difference ≥ −155.6 pp
    assert "Welch 95% [-155.6, +112.5]" in line and "it spans all of that" in line
    assert line.endswith("inconclusive (2 seeds; by the interval alone: not resolved)")


def test_the_learned_count_uses_the_protocols_90_percent(results):
    from looplab.studies.stars.retrofit import says_drops, says_learned

    text = says_learned(results)
    # at 4 loops: fixed 90 % and 100 % (both learned), stars 80 % (not) and 100 %
    assert "2 of 2 fixed seeds and 1 of 2 stars seeds" in text.split("**")[1]
    assert "The budget search (fixed, seed 91, 100 steps): its curve first reads ≥ 90 % at step 100" in text
    drops = says_drops(results)
    assert "The paper's SFT: 25.0 %" in drops and "The paper's STARS: 8.26 %" in drops


@pytest.mark.parametrize(
    "line, parts",
    [
        (
            "drop, fixed − stars: +1.0 pp, Welch 95% [-2.0, +4.0] (2 vs 2 seeds): inconclusive (2 seeds; by the "
            "interval alone: not resolved)",
            ("drop, fixed − stars", "+1.0 pp, Welch 95% [-2.0, +4.0] (2 vs 2 seeds)",
             "inconclusive (2 seeds; by the interval alone: not resolved)"),
        ),
        ("rule: a vs b: n/a (1 and 2 seeds; needs 2 each)", ("rule", "a vs b", "n/a (1 and 2 seeds; needs 2 each)")),
        ("rule: n/a (0 seeds)", ("rule", "", "n/a (0 seeds)")),
    ],
)  # fmt: skip
def test_a_decision_line_splits_into_question_evidence_and_verdict(line, parts):
    from looplab.studies.prose import said, split_decision

    assert split_decision(line) == parts
    assert said(line).startswith(f"**{parts[0][0].upper()}{parts[0][1:]}: {parts[2]}.**")
