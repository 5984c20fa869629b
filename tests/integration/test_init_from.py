"""``train.init_from``: a fine-tune starts from another run's weights, a fresh optimizer, and resumes bit for bit."""

from __future__ import annotations

import shutil

import torch

from looplab.checkpoint import checkpoint_dirs
from looplab.config import load_config
from looplab.experiment import Experiment
from looplab.train.trainer import train
from tests.conftest import TINY, train_tiny_run


def _config(root, steps: int, checkpoint_every: int, *overrides: str):
    path = root / "fine.toml"
    path.write_text(TINY.format(steps=steps, checkpoint_every=checkpoint_every))
    return load_config(path, list(overrides))


def _weights(run_dir) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in Experiment.from_run(run_dir).model.state_dict().items()}


def test_a_fine_tune_starts_from_the_source_weights_and_moves_from_there(tmp_path):
    _, source = train_tiny_run(tmp_path, 6, 3)
    start = train(_config(tmp_path, 0, 1, f"train.init_from={source}"), tmp_path / "zero", progress=False)
    fresh = train(_config(tmp_path, 0, 1), tmp_path / "fresh", progress=False)
    theirs = _weights(source)
    assert all(torch.equal(start.model.state_dict()[k], v) for k, v in theirs.items())
    assert any(not torch.equal(fresh.model.state_dict()[k], v) for k, v in theirs.items())
    tuned = train(_config(tmp_path, 3, 3, f"train.init_from={source}", "train.lr=1e-4"), tmp_path / "tuned", False)
    moved = [float((tuned.model.state_dict()[k] - v).abs().max()) for k, v in theirs.items()]
    assert 0 < max(moved) < 0.05  # three small steps from the source, not from a fresh initialisation


def test_a_killed_fine_tune_resumes_from_its_own_checkpoint_bit_for_bit(tmp_path):
    _, source = train_tiny_run(tmp_path, 4, 4)
    config = _config(tmp_path, 6, 3, f"train.init_from={source}")
    straight = train(config, tmp_path / "straight", progress=False)
    killed = tmp_path / "killed"
    train(config, killed, progress=False)
    last = checkpoint_dirs(killed)[-1]
    shutil.rmtree(last)  # as if killed after the step-3 checkpoint
    shutil.rmtree(source)  # a resume reads its own checkpoint only: the source may be gone
    resumed = train(config, killed, progress=False)
    for key, value in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key
