"""Data-parallel training under torchrun (2 CPU processes, gloo) against single-process training."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import run_cli, torchrun

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


def _weights(run_dir, step=20) -> dict[str, torch.Tensor]:
    folder = run_dir / "checkpoints" / f"step_{step:07d}"
    return {
        f"{file.name}:{name}": tensor
        for file in sorted(folder.glob("*.safetensors"))
        for name, tensor in load_file(file).items()
    }


def _losses(run_dir) -> dict[int, float]:
    records = map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
    return {record["step"]: record["loss"] for record in records}


def test_two_processes_train_like_one_and_resume(tiny_config, tmp_path):
    # The tiny config's `window` schedule draws a depth offset per row: drawn for the
    # global batch on every rank, so the shards train at single-process depths.
    args = ("train", str(tiny_config(steps=20, checkpoint_every=10)), "--no-progress")
    single, parallel = tmp_path / "single", tmp_path / "parallel"
    assert run_cli(*args, "--out", str(single)).returncode == 0
    result = torchrun(*args, "--out", str(parallel))
    assert result.returncode == 0, result.stderr

    expected, trained = _weights(single), _weights(parallel)
    assert expected.keys() == trained.keys()
    for name in expected:
        torch.testing.assert_close(trained[name], expected[name], atol=1e-4, rtol=1e-3, msg=name)
    assert _losses(parallel) == pytest.approx(_losses(single), rel=1e-5)

    # Resume with `looplab train --nproc 2` (torchrun's launcher, started by looplab): every rank
    # reloads step 10 and ends where the uninterrupted run did.
    shutil.rmtree(parallel / "checkpoints" / "step_0000020")
    result = run_cli(*args, "--out", str(parallel), "--nproc", "2")
    assert result.returncode == 0, result.stderr
    for name, tensor in _weights(parallel).items():
        assert torch.equal(tensor, trained[name]), name
    assert list(_losses(parallel)) == [5, 10, 15, 20]


def test_batch_size_must_split_over_the_ranks(tiny_config, tmp_path, monkeypatch):
    # Checked before joining the process group, so one process with torchrun's
    # variables shows exactly what each rank prints.
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    result = run_cli("train", str(tiny_config()), "--out", str(run_dir), "--set", "train.batch_size=15")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "batch_size 15" in lines[0] and "2 processes" in lines[0], result.stderr
    assert not run_dir.exists()


def test_the_launcher_checks_before_starting_and_fails_in_one_line(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    config = str(tiny_config())
    refused = run_cli("train", config, "--out", str(run_dir), "--nproc", "2", "--set", "train.batch_size=15")
    assert refused.returncode == 2 and not run_dir.exists()
    assert refused.stderr.strip().splitlines() == [
        "looplab: error: train.batch_size 15 does not split evenly over 2 processes (world size); use a multiple of 2"
    ]
    (tmp_path / "file").write_text("")
    failed = run_cli("train", config, "--out", str(tmp_path / "file"), "--nproc", "2", "--no-progress")
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert lines[0] == f"looplab: error: --out {tmp_path / 'file'} is a file, not a run dir"  # rank 0 alone
    assert len(lines) == 2 and lines[1].startswith("looplab: error: training failed on rank ")


def test_sigterm_to_the_launcher_checkpoints_every_rank(tiny_config, tmp_path):
    # Each rank records stop signals from its command's start, before the ranks meet: a signal that reaches
    # one rank during another's step waits for the step boundary every rank agrees on.
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "looplab", "train", str(tiny_config(steps=100000, checkpoint_every=100000))]
    launcher = subprocess.Popen(
        [*command, "--out", str(run_dir), "--nproc", "2", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "log.jsonl").is_file() and time.monotonic() < deadline:  # training has begun
        time.sleep(0.2)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("looplab: stopped by SIGTERM after step "), stderr
    assert len(list((run_dir / "checkpoints").iterdir())) == 1


def test_a_stop_signal_before_the_launch_starts_no_rank(tiny_config, tmp_path):
    from looplab.config import load_config
    from looplab.train.launch import launch
    from looplab.train.stop import Stopped, StopRequest

    stop = StopRequest()
    stop(signal.SIGTERM, None)  # as if SIGTERM arrived while the launcher read its config
    with pytest.raises(Stopped, match="stopped by SIGTERM before training began; nothing new was saved") as raised:
        launch(load_config(str(tiny_config()), []), 2, ["train"], tmp_path / "run", stop)
    assert raised.value.exit_code == 128 + signal.SIGTERM and not (tmp_path / "run").exists()
