"""Train a tiny looped LM on the KJV task with the ordinary trainer, then evaluate loss vs loops."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from looplab.config import load_config
from looplab.tasks import make_task
from looplab.text.evaluate import evaluate_lm_run, lm_loss_by_loops
from looplab.train.trainer import train

TINY_LM = [
    "task.name=kjv",
    "task.train_min=16",
    "task.train_max=16",
    "task.eval_lengths=[16]",
    "model.d_model=16",
    "model.n_heads=2",
    "model.core_layers=1",
    "model.prelude_layers=1",
    "model.coda_layers=1",
    "model.injection=concat",
    "model.causal=true",
    "schedule.name=fixed",
    "schedule.depth=2",
    "train.steps=5",
    "train.batch_size=8",
    "train.warmup_steps=1",
    "train.log_every=5",
    "run.threads=1",
]


def test_train_then_evaluate_loss_by_loops(tmp_path, capsys):
    run_dir = tmp_path / "lm"
    train(load_config(None, TINY_LM), run_dir, progress=False)
    summary = evaluate_lm_run(run_dir, max_loops=6, samples=8, progress=True)
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"eval: {run_dir} at step_") and "8 windows" in said[0] and "loops 1..6" in said[0]
    assert said[-1].startswith("eval: 6/6 (100%)"), said  # off a terminal: a counted line, the last at 100 %
    out = run_dir / "eval"
    for name in ("lm_loops.csv", "lm_loops.png", "lm_summary.json"):
        assert (out / name).stat().st_size > 0, name
    frame = pd.read_csv(out / "lm_loops.csv")
    assert list(frame.columns[:4]) == ["loops", "loss", "bits_per_byte", "accuracy"]
    assert frame.loops.tolist() == list(range(1, 7))
    assert frame.loss.map(math.isfinite).all() and (frame.loss > 0).all()
    assert ((frame.accuracy >= 0) & (frame.accuracy <= 1)).all()
    assert frame.bits_per_byte.tolist() == pytest.approx((frame.loss / math.log(2)).tolist())
    assert summary["training_depth"] == 2
    assert summary["loss_at_training_depth"] == pytest.approx(frame.loss[1])
    assert summary["best_loss"] == pytest.approx(frame.loss.min())
    assert math.isfinite(summary["loss_at_max_loops"])
    assert json.loads((out / "lm_summary.json").read_text()) == summary


def test_loss_by_loops_matches_forward_and_survives_non_finite_logits():
    config = load_config(None, TINY_LM)
    task = make_task("kjv")
    from looplab.model import LoopedTransformer

    torch.manual_seed(0)
    model = LoopedTransformer(config.model, task.vocab_size).eval()
    frame = lm_loss_by_loops(model, task, 12, 6, 3, seed=0, batch_size=4)
    # the one-unroll curve equals a separate forward pass at each depth
    from looplab.seeding import derive_generator

    generator = derive_generator(0, "lm-eval")
    batches = [task.sample_split(12, count, generator, "val") for count in (4, 2)]
    for loops in (1, 3):
        with torch.no_grad():
            losses = [
                torch.nn.functional.cross_entropy(
                    model(t, torch.ones_like(t, dtype=torch.bool), loops).flatten(0, 1),
                    labels.flatten(),
                    reduction="sum",
                )
                for t, labels in batches
            ]
        assert frame.loss[loops - 1] == pytest.approx(float(sum(losses)) / 72, rel=1e-5)
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    broken = lm_loss_by_loops(model, task, 12, 4, 2, seed=0)
    assert (broken.loss == math.inf).all() and (broken.nonfinite == 1).all() and (broken.accuracy == 0).all()


def test_plain_eval_of_a_text_run_reads_its_loss_at_the_runs_own_loops(tmp_path):
    """`looplab eval RUN` on a text run needs no --lm-loops: the loss against 1..eval.max_loops loops."""
    from looplab.cli import main

    run_dir = tmp_path / "lm"
    train(load_config(None, [*TINY_LM, "eval.max_loops=5", "eval.samples=8"]), run_dir, progress=False)
    assert main(["eval", str(run_dir)]) == 0
    frame = pd.read_csv(run_dir / "eval" / "lm_loops.csv")
    assert frame.loops.tolist() == list(range(1, 6))
    assert json.loads((run_dir / "eval" / "lm_summary.json").read_text())["samples"] == 8
