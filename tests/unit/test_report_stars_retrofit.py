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
