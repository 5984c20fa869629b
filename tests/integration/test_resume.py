"""Exact resume after SIGKILL, and a clean stop on a non-finite loss, gradient or weights."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from looplab import experiment
from looplab.checkpoint import latest_checkpoint, load_weights
from looplab.config import load_config
from looplab.errors import LooplabError
from looplab.schedules import base as schedules
from looplab.train.trainer import TrainingDiverged, train
from tests.conftest import TINY, run_cli


def _final_weights(run_dir, step, file="model.safetensors"):
    return load_file(run_dir / "checkpoints" / f"step_{step:07d}" / file)


def _state(run_dir, step):
    return json.loads((run_dir / "checkpoints" / f"step_{step:07d}" / "state.json").read_text())


TRM_RECIPE = [  # TRM's recurrence, deep supervision with only each segment's last loop backpropagated, its head
    "model.recurrence=trm", "model.latent_steps=2", "schedule.name=act_bce", "schedule.t_max=4",
    "train.segment_loops=2", "train.backprop_loops=1",
]  # fmt: skip


@pytest.mark.parametrize(
    "schedule",
    [["schedule.name=window"], ["schedule.name=rl_halting", "schedule.t_max=6"], TRM_RECIPE],
    ids=["window", "rl_halting", "trm"],
)
def test_resume_after_sigkill_is_bitwise_identical(tiny_config, tmp_path, schedule):
    steps = 150
    config = tiny_config(steps=steps, checkpoint_every=10)
    args = ["train", str(config), "--no-progress"] + [arg for o in schedule for arg in ("--set", o)]
    straight = tmp_path / "straight"
    assert run_cli(*args, "--out", str(straight)).returncode == 0

    killed = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "looplab", *args, "--out", str(killed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while latest_checkpoint(killed) is None or latest_checkpoint(killed).name < "step_0000040":
        assert process.poll() is None and time.time() < deadline, "run ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    interrupted_at = json.loads((latest_checkpoint(killed) / "state.json").read_text())["step"]
    assert interrupted_at < steps

    assert run_cli(*args, "--out", str(killed)).returncode == 0
    files = sorted(p.name for p in (straight / "checkpoints" / f"step_{steps:07d}").glob("*.safetensors"))
    for file in files:
        expected, resumed = _final_weights(straight, steps, file), _final_weights(killed, steps, file)
        assert expected.keys() == resumed.keys()
        for name in expected:
            assert torch.equal(expected[name], resumed[name]), (file, name)
    assert _state(straight, steps) == _state(killed, steps)
    steps_logged = [json.loads(line)["step"] for line in (killed / "log.jsonl").read_text().splitlines()]
    assert steps_logged == sorted(set(steps_logged)), "log holds duplicate steps after resume"


def poison_loss_from(monkeypatch, call: int, poison) -> None:
    """Make the training loss ``poison(loss)`` from its ``call``-th evaluation on."""
    real_loss = schedules.depth_supervised_loss
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        loss = real_loss(*args)
        return poison(loss) if calls["n"] >= call else loss

    monkeypatch.setattr(schedules, "depth_supervised_loss", poisoned)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tiny_config, tmp_path, monkeypatch):
    config = load_config(tiny_config(steps=30, checkpoint_every=4))
    poison_loss_from(monkeypatch, 7, lambda loss: loss * float("nan"))
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="non-finite loss nan at step 7.*step_0000004"):
        train(config, run_dir, progress=False)
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == "step_0000004"
    exp = experiment.Experiment.build(config)
    load_weights(checkpoint, exp.modules())
    assert all(torch.isfinite(p).all() for p in exp.model.parameters())
    assert isinstance(TrainingDiverged("x"), LooplabError)


class NanGradient(torch.autograd.Function):
    """Identity forward (a finite loss), NaN backward (a poisoned gradient)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def test_nan_gradient_under_a_finite_loss_is_not_applied(tiny_config, tmp_path, monkeypatch):
    config = load_config(tiny_config(steps=30, checkpoint_every=4))
    poison_loss_from(monkeypatch, 6, NanGradient.apply)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="non-finite grad norm nan at step 6, not applied.*step_0000004"):
        train(config, run_dir, progress=False)
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_0000004"]


def test_huge_learning_rate_never_saves_or_evaluates_poisoned_weights(tmp_path):
    """lr = 1e6: finite losses with NaN gradients or weights; every kept checkpoint is finite."""
    run_dir = tmp_path / "run"
    (tmp_path / "tiny.toml").write_text(TINY.format(steps=40, checkpoint_every=2))
    result = run_cli(
        "train",
        str(tmp_path / "tiny.toml"),
        "--out",
        str(run_dir),
        "--no-progress",
        "--set",
        "train.lr=1e6",
        "--set",
        "train.keep_checkpoints=1",
        "--set",
        "train.warmup_steps=0",
    )
    assert result.returncode == 1, result.stderr
    assert "non-finite" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        exp = experiment.Experiment.build(load_config(tmp_path / "tiny.toml"))
        load_weights(checkpoint, exp.modules())
        assert experiment.all_finite(exp.modules())


def test_eval_of_a_non_finite_checkpoint_is_an_error(tiny_config, tmp_path):
    config_path = tiny_config(steps=4, checkpoint_every=4)
    run_dir = tmp_path / "run"
    train(load_config(config_path), run_dir, progress=False)
    weights = latest_checkpoint(run_dir) / "model.safetensors"
    tensors = load_file(weights)
    tensors["head.bias"] = torch.full_like(tensors["head.bias"], float("nan"))
    save_file(tensors, weights)
    result = run_cli("eval", str(run_dir))
    assert result.returncode == 2 and "non-finite weights" in result.stderr and "Traceback" not in result.stderr


def test_resume_drops_a_torn_log_line(tiny_config, tmp_path):
    config = load_config(tiny_config(steps=20, checkpoint_every=10))
    run_dir = tmp_path / "run"
    train(config, run_dir, progress=False)
    log = run_dir / "log.jsonl"
    # as if killed mid-write after step 20's checkpoint was removed: resume from step 10
    shutil.rmtree(run_dir / "checkpoints" / "step_0000020")
    log.write_text(log.read_text() + '{"step": 25, "lo')
    train(config, run_dir, progress=False)
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == [5, 10, 15, 20]


@pytest.mark.parametrize("stop_after, signame", [(25, "SIGTERM"), (90, "SIGINT")])
def test_stop_signal_checkpoints_and_resume_is_bitwise_identical(tiny_config, tmp_path, stop_after, signame):
    """A scheduler's stop signal saves a checkpoint at the next step (none was due: checkpoint_every is
    past the end), exits with 128 + the signal's number and one line, and the same command resumes."""
    steps = 300  # a wide margin after the stop point, so the run cannot end before the signal arrives
    config = tiny_config(steps=steps, checkpoint_every=1000)
    args = ["train", str(config), "--no-progress", "--set", "train.log_every=1"]
    straight = tmp_path / "straight"
    assert run_cli(*args, "--out", str(straight)).returncode == 0

    stopped = tmp_path / "stopped"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "looplab", *args, "--out", str(stopped)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log, deadline = stopped / "log.jsonl", time.time() + 120
    while not log.exists() or len(log.read_text().splitlines()) < stop_after:
        assert process.poll() is None and time.time() < deadline, "run ended before it could be stopped"
        time.sleep(0.01)
    process.send_signal(getattr(signal, signame))
    err = process.communicate(timeout=60)[1]
    assert process.returncode == 128 + getattr(signal, signame)
    (line,) = err.strip().splitlines()
    stopped_at = json.loads((latest_checkpoint(stopped) / "state.json").read_text())["step"]
    assert line.startswith(f"looplab: stopped by {signame} after step {stopped_at};") and "resume" in line
    assert stop_after <= stopped_at < steps

    assert run_cli(*args, "--out", str(stopped)).returncode == 0
    for file in sorted(p.name for p in (straight / "checkpoints" / f"step_{steps:07d}").glob("*.safetensors")):
        expected, resumed = _final_weights(straight, steps, file), _final_weights(stopped, steps, file)
        assert all(torch.equal(expected[name], resumed[name]) for name in expected), file
    assert _state(straight, steps) == _state(stopped, steps)


def test_checkpoint_minutes_saves_by_wall_clock(tiny_config, tmp_path):
    config = load_config(tiny_config(steps=12, checkpoint_every=1000), ["train.keep_checkpoints=100"])
    timed = dataclasses.replace(config, train=dataclasses.replace(config.train, checkpoint_minutes=1e-9))
    train(timed, tmp_path / "timed", progress=False)
    saved = sorted(p.name for p in (tmp_path / "timed" / "checkpoints").iterdir())
    assert saved == [f"step_{s:07d}" for s in range(1, 13)]  # every step is past the (tiny) interval
    train(config, tmp_path / "steps", progress=False)
    assert [p.name for p in (tmp_path / "steps" / "checkpoints").iterdir()] == ["step_0000012"]


PREVIOUS_RELEASE_CONFIG = Path(__file__).resolve().parents[1] / "data" / "run_config_v0.toml"


def test_a_run_dir_written_by_the_previous_release_loads_resumes_bit_for_bit_and_evaluates(tmp_path):
    """A config.toml that holds every schedule's keys (as looplab wrote it before schedules declared their
    own) is the same run: it loads, resumes exactly where it stopped, and evaluates."""
    from looplab.eval.run import evaluate_run
    from looplab.experiment import Experiment

    config = load_config(PREVIOUS_RELEASE_CONFIG)
    reference, run = tmp_path / "reference", tmp_path / "run"
    train(config, reference, progress=False)
    train(load_config(PREVIOUS_RELEASE_CONFIG), run, progress=False)
    shutil.rmtree(latest_checkpoint(run))  # back to the checkpoint at step 6 of 12
    (run / "config.toml").write_text(PREVIOUS_RELEASE_CONFIG.read_text())
    assert Experiment.from_run(run).config.schedule.params == {"window": 3, "t_max": 12}
    train(load_config(PREVIOUS_RELEASE_CONFIG), run, progress=False)
    assert latest_checkpoint(run).name == latest_checkpoint(reference).name == "step_0000012"
    assert _final_weights(run, 12).keys() == _final_weights(reference, 12).keys()
    assert all(
        torch.equal(a, b) for a, b in zip(_final_weights(run, 12).values(), _final_weights(reference, 12).values())
    )
    assert 0 <= evaluate_run(run)["oracle_id"] <= 1
