"""The Ray backend against a real Ray head started on loopback, stopped by PID afterwards."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.test_sweep import SWEEP, _results, sweep_cli, write_sweep


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@pytest.fixture(scope="module")
def ray_head():
    """A one-node Ray cluster on 127.0.0.1 with token auth; yields (address, client env)."""
    # Ray's session sockets live under the temp dir, and AF_UNIX paths must stay short.
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    port = _free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        address = f"127.0.0.1:{port}"
        probe = f"import ray; ray.init(address={address!r}); ray.shutdown()"
        deadline = time.monotonic() + 90
        while subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode != 0:
            assert head.poll() is None and time.monotonic() < deadline, "the Ray head did not come up"
            time.sleep(1)
        yield address, env
    finally:
        for pid in [*_descendants(head.pid), head.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        head.wait()


def test_ray_sweep_equals_local_and_resumes(tmp_path, ray_head):
    address, env = ray_head
    sweep_file = write_sweep(tmp_path, SWEEP.replace("seeds = [0, 1]", "seeds = [0]"))
    local = tmp_path / "local"
    assert sweep_cli(sweep_file, local).returncode == 0

    out = tmp_path / "ray"
    args = ["sweep", str(sweep_file), "--out", str(out), "--no-progress", "--backend", "ray", "--address", address]
    first = subprocess.run([sys.executable, "-m", "looplab", *args], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    pd.testing.assert_frame_equal(_results(out), _results(local), check_exact=True)

    # An unfinished point (no result.json) is run again from its checkpoint; the finished one is skipped.
    redo, keep = sorted((out / "runs").iterdir())
    (redo / "result.json").unlink()
    kept = (keep / "result.json").stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-m", "looplab", *args], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (redo / "result.json").is_file() and (keep / "result.json").stat().st_mtime_ns == kept
    pd.testing.assert_frame_equal(_results(out), _results(local), check_exact=True)
