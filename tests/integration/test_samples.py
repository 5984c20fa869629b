"""eval/samples.parquet holds every sample's outcome: summary.json can be recomputed from it alone."""

import json

import pandas as pd
import pytest
import torch

from looplab.eval.grid import eval_batches
from looplab.eval.metrics import summarize
from looplab.eval.samples import read_samples
from looplab.exits import exit_params
from looplab.rundir import load_run_config
from looplab.tasks import make_task
from tests.conftest import run_cli

METRICS = [
    "oracle_id",
    "oracle_ood",
    "policy_id",
    "policy_ood",
    "gap",
    "front90",
    "flip_rate",
    "flip_curve",
    "per_length",
    "exits",
    "halting",
]


@pytest.mark.parametrize("schedule", ["window", "rl_halting"])
def test_summary_is_recomputed_from_the_samples_file(tiny_config, tmp_path, schedule):
    run = tmp_path / "run"
    trained = run_cli(
        "train",
        str(tiny_config(steps=10)),
        "--out",
        str(run),
        "--set",
        f"schedule.name={schedule}",
        "--set",
        "eval.exits.fixed.depth=5",
        "--no-progress",
    )
    assert trained.returncode == 0, trained.stderr
    evaluated = run_cli("eval", str(run))
    assert evaluated.returncode == 0, evaluated.stderr
    summary = json.loads((run / "eval" / "summary.json").read_text())
    config = load_run_config(run)
    assert config.eval.exits["fixed"]["depth"] == 5
    again = json.loads(
        json.dumps(summarize(read_samples(run / "eval"), config.task.train_max, exit_params(config.eval.exits)))
    )
    assert {key: again[key] for key in METRICS} == {key: summary[key] for key in METRICS}
    frame = pd.read_parquet(run / "eval" / "samples.parquet")
    assert len(frame) == len(config.task.eval_lengths) * config.eval.samples
    assert ("hazard_logits" in frame) == (schedule == "rl_halting")
    assert {"depth_policy", "depth_fixed", "depth_confidence", "depth_convergence"} <= set(frame.columns)


def test_eval_batches_regenerate_the_evaluated_instances(tiny_config, tmp_path):
    """Sample i of length n is the i-th row eval_batches yields; re-drawing gives the same instances."""
    task = make_task("binary_addition")
    first = torch.cat([b.tokens for b in eval_batches(task, 6, 40, 16, seed=3)])
    again = torch.cat([b.tokens for b in eval_batches(task, 6, 40, 16, seed=3)])
    assert first.shape == (40, task.seq_len(6)) and torch.equal(first, again)
    assert not torch.equal(first, torch.cat([b.tokens for b in eval_batches(task, 6, 40, 16, seed=4)]))
