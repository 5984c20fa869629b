"""The stars-lm study's plumbing on tiny models: mixture training, loop-scaling evaluation, report."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from looplab.config import load_config
from looplab.eval.grid import unroll_outcomes
from looplab.experiment import Experiment
from looplab.report import write_report
from looplab.studies import load_studies
from looplab.sweep import load_sweep, run_sweep
from looplab.text.evaluate import evaluate_lm_run
from looplab.text.reasoning import relative_drop, scaling_summary
from looplab.train.trainer import train

load_studies()  # the papers, page blocks and collectors these tests read are registered by the studies

TINY = [
    "task.name=kjv_arithmetic",
    "task.train_min=1",
    "task.train_max=2",
    "task.eval_lengths=[1,2,3]",
    "model.d_model=16",
    "model.n_heads=2",
    "model.core_layers=1",
    "model.prelude_layers=0",
    "model.coda_layers=0",
    "model.injection=none",
    "model.norm=rmsnorm",
    "model.placement=post_sandwich",
    "model.causal=true",
    "schedule.name=fixed",
    "schedule.depth=2",
    "train.steps=4",
    "train.batch_size=8",
    "train.warmup_steps=1",
    "train.log_every=4",
    "eval.max_loops=6",
    "eval.samples=8",
    "eval.exits.fixed.depth=2",
    "run.threads=1",
]


def test_mixture_run_gets_reasoning_columns_and_summary(tmp_path):
    run_dir = tmp_path / "lm"
    train(load_config(None, TINY), run_dir, progress=False)
    summary = evaluate_lm_run(run_dir, max_loops=6, samples=8)
    out = run_dir / "eval"
    frame = pd.read_csv(out / "lm_loops.csv")
    assert frame.loops.tolist() == list(range(1, 7))
    for column in ("loss", "reasoning_id", "reasoning_ood", "state_norm", "spectral_radius"):
        assert frame[column].map(math.isfinite).all(), column
    assert frame.reasoning_id.between(0, 1).all() and (frame.state_norm > 0).all()
    grid = pd.read_csv(out / "reasoning_loops.csv")
    assert sorted(grid.length.unique()) == [1, 2, 3] and set(grid.split) == {"id", "ood"}
    # the pooled ID column is the mean over the training sizes (equal samples each)
    per_loop = grid[grid.split == "id"].groupby("loops").accuracy.mean().to_numpy()
    assert frame.reasoning_id.to_numpy() == pytest.approx(per_loop)
    scaling = summary["scaling"]
    assert scaling["id"]["at_depth"] == pytest.approx(frame.reasoning_id[1])
    assert scaling["id"]["at_twice_depth"] == pytest.approx(frame.reasoning_id[3])
    assert scaling["loss"]["best"] == pytest.approx(frame.loss.min())
    assert (out / "lm_scaling.png").stat().st_size > 0
    assert json.loads((out / "lm_summary.json").read_text())["scaling"] == scaling


def greedy_answer(model, tokens: torch.Tensor, loops: int, answer_len: int) -> list[int]:
    """Decode ``answer_len`` bytes greedily after the prompt ``tokens`` [L], each at ``loops`` loops."""
    ids = tokens.clone()
    for _ in range(answer_len):
        logits = model(ids[None], torch.ones(1, len(ids), dtype=torch.bool), loops)
        ids = torch.cat([ids, logits[0, -1].argmax()[None]])
    return ids[len(tokens) :].tolist()


def test_teacher_forced_exact_match_is_greedy_decoding(tmp_path):
    """Whole-answer exact match on the next-byte layout equals decoding the answer greedily."""
    run_dir = tmp_path / "lm"
    train(load_config(None, [*TINY, "train.steps=30"]), run_dir, progress=False)
    exp = Experiment.from_run(run_dir)
    exp.model.eval()
    batch = exp.task.reasoning.sample(1, 24, torch.Generator().manual_seed(5))
    correct = unroll_outcomes(exp.model, batch, 3)["correct"]
    for loops in (1, 2, 3):
        with torch.no_grad():
            forced = exp.model(batch.tokens, batch.valid, loops).argmax(-1)  # [B, L]
        for row in range(len(batch.tokens)):
            prompt = batch.tokens[row, :-1]  # the digit's position is the answer's second read-out
            truth = batch.labels[row, -2:].tolist()
            with torch.no_grad():
                decoded = greedy_answer(exp.model, prompt, loops, 2)
            assert decoded[0] == int(forced[row, -2])
            if decoded[0] == truth[0]:  # then greedy saw the true prefix, as teacher forcing does
                assert decoded[1] == int(forced[row, -1])
            assert (decoded == truth) == bool(correct[row, loops - 1]), (row, loops)


def test_relative_drop_and_summary_edges():
    assert relative_drop(0.8, 0.6) == pytest.approx(0.25)
    assert relative_drop(2.0, 3.0, lower_is_better=True) == pytest.approx(0.5)
    assert relative_drop(0.0, 0.5) is None and relative_drop(None, 0.5) is None
    frame = pd.DataFrame(
        {
            "loops": [1, 2, 3, 4],
            "loss": [3.0, 2.0, float("inf"), 2.5],
            "reasoning_id": [0.2, 0.9, 0.5, 0.45],
            "reasoning_ood": [np.nan] * 4,
            "state_norm": [1.0, 2.0, 3.0, 4.0],
            "spectral_radius": [1.2, 1.1, 1.0, 0.9],
        }
    )
    summary = scaling_summary(frame, 2)
    assert summary["id"]["best"] == 0.9 and summary["id"]["best_loops"] == 2
    assert summary["id"]["relative_drop"] == pytest.approx(0.5)
    assert summary["loss"]["best_loops"] == 2 and summary["loss"]["at_max_loops"] == 2.5
    assert "ood" not in summary  # never measured: no entry rather than NaNs
    assert summary["state_norm_growth"] == 4.0


def test_report_puts_the_drop_table_beside_the_paper(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    recipes = {"fixed": "schedule.name=fixed", "stars": "schedule.name=lognormal"}
    for recipe, schedule in recipes.items():
        config = load_config(None, [*TINY, schedule, "schedule.mu=0.7", "schedule.hi=4"])
        (configs / f"post_sandwich-{recipe}.toml").write_text(config.to_toml())
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text('[sweep]\nconfigs = ["configs/*.toml"]\nseeds = 2\n')
    out = tmp_path / "sweep"
    run_sweep(load_sweep(sweep_file), out, workers=1, progress=False)
    # a retrofit result as looplab.studies.stars.study writes it (that part needs SmolLM2; see tests/slow)
    loops = pd.DataFrame(
        {
            "loops": range(1, 9),
            "loss": np.linspace(3, 4, 8),
            "reasoning_id": [0.1, 0.3, 0.5, 0.8, 0.7, 0.6, 0.5, 0.4],
            "reasoning_ood": 0.1,
            "state_norm": 5.0,
            "spectral_radius": 1.0,
        }
    )
    folder = out / "retrofit" / "fixed-seed0"
    folder.mkdir(parents=True)
    loops.to_csv(folder / "loops.csv", index=False)
    summary = {"recipe": "fixed", "seed": 0, **scaling_summary(loops, 4)}
    (folder / "summary.json").write_text(json.dumps(summary))
    report = write_report(out, "stars")
    table = pd.read_csv(report / "paper_stars_lm.csv")
    scratch = table[table.part == "from scratch, post_sandwich"]
    assert set(scratch.recipe) == {"fixed", "stars"} and (scratch.runs == 2).all()
    fixed = scratch[scratch.recipe == "fixed"].iloc[0]
    assert fixed["paper.model"] == "Ouro-1.4B-SFT" and fixed["paper.drop_pct"] == 25.0
    assert (report / "kjv_arithmetic-loopscaling.png").stat().st_size > 0
    assert (report / "retrofit-retrofitscaling.png").stat().st_size > 0
    curves = pd.read_csv(report / "lm_curves.csv")
    assert set(curves.recipe) == {"fixed", "stars"} and curves.loops.max() == 8
    assert set(curves["shape"]) == {"post_sandwich", "SmolLM2-135M retrofit"}
    retrofit = table[table.part == "SmolLM2-135M retrofit"].iloc[0]
    assert retrofit["Acc at 4 (%).mean"] == pytest.approx(80.0)
    assert retrofit["Rel. drop 4→8 (%).mean"] == pytest.approx(50.0)  # 0.8 → 0.4
    assert retrofit["Best at loops.mean"] == 4
    markdown = (report / "table.md").read_text()
    assert "loop scaling of a looped LM" in markdown and "Ouro-1.4B-STARS" in markdown
