"""Shared fixtures: tiny configs that train in seconds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TINY = """
[task]
name = "binary_addition"
train_min = 1
train_max = 6
eval_lengths = [4, 6, 8]

[model]
d_model = 32
n_heads = 2
core_layers = 1

[schedule]
name = "window"
window = 2
t_max = 7

[train]
steps = {steps}
batch_size = 16
lr = 3e-3
warmup_steps = 5
log_every = 5
checkpoint_every = {checkpoint_every}

[eval]
max_loops = 10
samples = 32

[run]
seed = 3
threads = 1
"""


@pytest.fixture
def tiny_config(tmp_path: Path):
    """Write a tiny config TOML and return its path; format knobs via keyword arguments."""

    def write(steps: int = 20, checkpoint_every: int = 10, name: str = "tiny.toml") -> Path:
        path = tmp_path / name
        path.write_text(TINY.format(steps=steps, checkpoint_every=checkpoint_every))
        return path

    return write


def train_tiny_run(root: Path, steps: int, checkpoint_every: int, *overrides: str) -> tuple[Path, Path]:
    """Train the tiny config into ``root/run`` through the CLI; returns (config path, run dir)."""
    config = root / "tiny.toml"
    config.write_text(TINY.format(steps=steps, checkpoint_every=checkpoint_every))
    run_dir = root / "run"
    sets = [arg for override in overrides for arg in ("--set", override)]
    result = run_cli("train", str(config), "--out", str(run_dir), "--no-progress", *sets)
    assert result.returncode == 0, result.stderr
    return config, run_dir


def run_cli(*args: str, env_extra: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -m looplab ARGS`` in a subprocess with one torch thread (and ``env_extra`` set)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "looplab", *args], capture_output=True, text=True, env=env, **kwargs)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 -m looplab ARGS`` on loopback, one torch thread per process."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "looplab",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def pytest_configure(config):
    """One torch thread per test process: xdist workers share 2 cores, and the
    tests' tiny tensors gain nothing from more threads (they run ~4x slower)."""
    import torch

    torch.set_num_threads(1)
