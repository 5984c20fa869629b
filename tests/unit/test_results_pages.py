"""Committed results pages equal what their CSVs give, and the blocks compute what they say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from looplab.errors import LooplabError
from looplab.eval.grid import LengthOutcome
from looplab.eval.samples import SAMPLES_FILE, samples_frame
from looplab.exits import exit_params
from looplab.report.effect import effect
from looplab.report.pages import BLOCKS, regenerate, render_page
from looplab.studies import earlier as published
from looplab.studies import load_studies

load_studies()  # the papers, page blocks and collectors these tests read are registered by the studies

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_committed_pages_equal_what_their_csvs_give():
    stale = regenerate(RESULTS, check=True)
    assert stale == [], f"out of date (run `looplab results`): {stale}"


def test_every_generated_block_is_on_a_page():
    used = set()
    for page in RESULTS.glob("*.md"):
        used |= {line.split()[2] for line in page.read_text().splitlines() if line.startswith("<!-- generated:")}
    regenerate(RESULTS, check=True)  # imports every generator
    assert used == set(BLOCKS)


def test_a_block_is_rewritten_and_the_prose_kept(tmp_path, monkeypatch):
    monkeypatch.setitem(BLOCKS, "test/echo", lambda results_dir: f"from {results_dir.name}\n")
    text = "intro\n<!-- generated: test/echo -->\nstale\n<!-- end generated -->\nafter\n"
    assert render_page(text, tmp_path) == (
        f"intro\n<!-- generated: test/echo -->\nfrom {tmp_path.name}\n<!-- end generated -->\nafter\n"
    )
    with pytest.raises(LooplabError, match="unknown generated block 'test/nothing'"):
        render_page("<!-- generated: test/nothing -->\n<!-- end generated -->", tmp_path)


def test_check_writes_nothing_and_names_the_stale_page(tmp_path, monkeypatch):
    monkeypatch.setitem(BLOCKS, "test/echo", lambda results_dir: "fresh")
    page = tmp_path / "page.md"
    page.write_text("<!-- generated: test/echo -->\nold\n<!-- end generated -->\n")
    assert regenerate(tmp_path, check=True) == [page]
    assert "old" in page.read_text()
    assert regenerate(tmp_path) == [page] and "fresh" in page.read_text()
    assert regenerate(tmp_path, check=True) == []


def test_t_and_chi2_cells_by_hand():
    # n = 8, mean 40, std 10: t(0.975, 7) = 2.3646
    half = stats.t.ppf(0.975, 7) * 10 / math.sqrt(8)
    assert published._t_cell(8, 40.0, 10.0, 1) == f"40.0 ± 10.0 [{40 - half:.1f}, {40 + half:.1f}]"
    assert published._t_cell(0, math.nan, math.nan, 1) == "n/a (0 seeds)"
    assert published._t_cell(1, 40.0, math.nan, 1) == "40.0"
    lo, hi = (10 * math.sqrt(7 / stats.chi2.ppf(q, 7)) for q in (0.975, 0.025))
    assert published.chi2_cell(8, 10.0) == f"10.0 [{lo:.1f}, {hi:.1f}]"


def test_aggregate_effects_match_the_per_seed_test():
    """Welch and F from (n, mean, std) equal the per-seed computation of looplab.report.effect."""
    seeds = pd.read_csv(RESULTS / "stopping-pilot" / "C-dyck1-nope-window1-T15.csv")
    rows = []
    for schedule, part in seeds.groupby("schedule"):
        rows.append(
            {
                "task.name": "dyck1",
                "variant": schedule,
                "gap_pp.n": len(part),
                "gap_pp.mean": 100 * part["gap"].mean(),
                "gap_pp.std": 100 * part["gap"].std(ddof=1),
                "oracle_ood_pct.n": len(part),
                "oracle_ood_pct.std": 100 * part["oracle_ood"].std(ddof=1),
            }
        )
    (line,) = published.aggregate_effects(pd.DataFrame(rows), "dyck1", "fixed", ["window"])
    fixed, window = seeds[seeds["schedule"] == "fixed"], seeds[seeds["schedule"] == "window"]
    full = effect(fixed["oracle_ood"], window["oracle_ood"], 100 * fixed["gap"], 100 * window["gap"])
    assert line[2] == f"{full.gap_difference:.1f} [{full.gap_welch[0]:.1f}, {full.gap_welch[1]:.1f}]"
    assert line[3] == f"{full.ratio:.2f} [{full.ratio_f[0]:.2f}, {full.ratio_f[1]:.2f}]"


# ----------------------------------------------------------------------------- the confirmatory study's rows


def _b(rows) -> np.ndarray:
    return np.array(rows, dtype=bool)


def _fake_run(root: Path, name: str, schedule: str, seed: int) -> Path:
    """A run dir with a config, a log and per-sample outcomes at 15 and 30 loops (train_max 10)."""
    from looplab.config import load_config

    run = root / "runs" / name
    config = load_config("stopping-small/dyck1-fixed", [f"schedule.name={schedule!r}", f"run.seed={seed}"])
    run.mkdir(parents=True)
    (run / "config.toml").write_text(config.to_toml())
    (run / "log.jsonl").write_text("\n".join(json.dumps({"step": s, "block_evals": 10.0}) for s in (1, 2)))
    for horizon, folder in ((15, "eval"), (30, "eval/loops30")):
        correct = np.zeros((2, horizon), dtype=bool)
        correct[0, 11:] = True  # sample 0 right from K = 12: Oracle 0.5, at the policy depth 10 wrong
        flips = np.zeros((2, horizon - 1), dtype=bool)
        flips[1, [9, 12]] = True  # sample 1 flips from K = 10 and K = 13
        outcomes = [
            LengthOutcome(8, np.ones((2, horizon), dtype=bool), np.zeros((2, horizon - 1), bool), np.array([10, 10])),
            LengthOutcome(16, correct, flips, np.array([10, 10])),
        ]
        (run / folder).mkdir(parents=True)
        samples_frame(outcomes, exit_params({"fixed": {"depth": 10}})).to_parquet(run / folder / SAMPLES_FILE)
    return run


def test_collect_recomputes_each_run_at_both_horizons(tmp_path):
    from looplab.studies.stopping.confirm import collect

    _fake_run(tmp_path / "sweep", "a", "fixed", 100)
    frame = collect([tmp_path / "sweep"], tmp_path / "out")
    assert list(frame["horizon"]) == [15, 30]
    row = frame.set_index("horizon").loc[15]
    assert (row["arm"], row["seed"], row["oracle_ood"], row["policy_ood"]) == ("fixed", 100, 0.5, 0.0)
    assert row["gap"] == pytest.approx(0.5) and row["oracle_id"] == 1.0 and row["front90"] == 10
    # K = 10..14 over the 2 OOD samples: 10 pairs, 2 flips (sample 1 at K = 10 and 13)
    assert row["flip_rate"] == pytest.approx(2 / 10) and row["flip_pairs"] == 10
    assert frame.set_index("horizon").loc[30, "flip_pairs"] == 2 * 20
    assert row["block_evals"] == 10.0 and math.isnan(row["halting_entropy"])
    curves = pd.read_csv(tmp_path / "out" / "flip_curves.csv")
    assert len(curves) == 14 + 29
    assert curves[(curves.horizon == 15) & (curves.loops == 10)]["flip_rate"].iloc[0] == pytest.approx(0.5)


def test_collect_refuses_a_run_without_its_second_read(tmp_path):
    from looplab.studies.stopping.confirm import collect

    run = _fake_run(tmp_path / "sweep", "a", "fixed", 100)
    (run / "eval" / "loops30" / SAMPLES_FILE).unlink()
    with pytest.raises(LooplabError, match="evaluate the run to 30 loops first"):
        collect([tmp_path / "sweep"], tmp_path / "out")


@pytest.mark.parametrize(
    "stem, mean, std, shown",
    [
        ("Min accuracy, loops 4–100 (%)", 16.0, 17.2, "16.0 ± 17.2 [0.0, 58.7]"),
        ("Peak accuracy (%)", 99.3, 0.6, "99.3 ± 0.6 [97.8, 100.0]"),
        ("Rel. drop peak→last (%)", 0.8, 0.6, "0.8 ± 0.6 [0.0, 2.3]"),
        ("Rel. drop 4→8 loops (%)", 38.9, 34.4, "38.9 ± 34.4 [-46.6, 100.0]"),
        ("Peak at loops", 2.3, 0.6, "2.3 ± 0.6 [1.0, 3.8]"),
        ("fixed_point_self_cos", 0.9, 0.1, "0.9 ± 0.1 [0.7, 1.0]"),
        ("steps_trained", 5.0, 10.0, "5.0 ± 10.0 [-19.8, 29.8]"),
    ],
)
def test_seed_aggregate_intervals_are_clipped_to_the_metrics_range(stem, mean, std, shown):
    from looplab.studies.earlier import _t_cell, value_range

    assert _t_cell(3, mean, std, 1, value_range(stem)) == shown
