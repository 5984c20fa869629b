"""How long the analyses take on the demo model at 64 loops, and the spectral analysis against its former default.

Trains the demo config (binary addition, d 64, 2 core layers) for ``--steps`` steps
in a temporary folder (or takes ``--run-dir``), then times, each in a fresh process
through the CLI as a user runs them:

- ``analyze RUN --loops 64`` (the mechanistic analysis, 8 samples, MLP ablation on)
- ``analyze spectral RUN --loops 64`` (4 samples: warm-started power iteration, 10
  iterations per loop, exact eigenvalues at loops 1, 32, 64)
- ``analyze pca RUN --loops 64``

Goal: each ≤ 60 s on 2 cores. The former spectral default (50 power iterations per loop
from a random start, exact eigenvalues at every loop) took over 16 minutes at 64 loops;
it is timed here at ``--former-loops`` loops (default 4) and projected to 64 by its cost
per loop, which is the same at every loop (one exact Jacobian per sample and loop).

    python bench/analysis.py [--run-dir runs/demo] [--steps 200] [--former-loops 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import print_measure, print_table, print_verdict

GOAL_S = 60.0
LOOPS = 64


def looplab(*args: str) -> float:
    """Run ``python -m looplab ARGS`` and return its wall time in seconds (raising if it fails)."""
    began = time.perf_counter()
    process = subprocess.run([sys.executable, "-m", "looplab", *args], capture_output=True, text=True)
    if process.returncode != 0:
        raise SystemExit(f"looplab {' '.join(args)} failed:\n{process.stderr}")
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a trained run to analyse (default: train the demo config briefly)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of the demo run made when none is given")
    parser.add_argument("--former-loops", type=int, default=4, help="loops the former spectral default is timed at")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run_dir
        if run_dir is None:
            run_dir = str(Path(scratch) / "demo")
            looplab("train", "demo", "--out", run_dir, "--set", f"train.steps={args.steps}", "--no-progress")
        out = Path(scratch) / "analysis"
        seconds = {
            "analyze (mechanistic)": looplab(
                "analyze", "mechanistic", run_dir, "--loops", str(LOOPS), "--out", str(out / "m")
            ),
            "analyze spectral": looplab("analyze", "spectral", run_dir, "--loops", str(LOOPS), "--out", str(out / "s")),
            "analyze pca": looplab("analyze", "pca", run_dir, "--loops", str(LOOPS), "--out", str(out / "p")),
        }
        former = looplab(
            "analyze", "spectral", run_dir, "--loops", str(args.former_loops), "--iters", "50",
            "--exact-at", "all", "--out", str(out / "former"),
        )  # fmt: skip
        # one process start and model load is in both; the per-loop part scales with the loops
        start = looplab("analyze", "spectral", run_dir, "--loops", "1", "--exact-at", "none", "--out", str(out / "one"))
        former_projected = start + (former - start) * LOOPS / args.former_loops
    rows = [[name, f"{value:.1f}"] for name, value in seconds.items()]
    rows.append([f"former spectral default at {args.former_loops} loops (measured)", f"{former:.1f}"])
    rows.append([f"former spectral default at {LOOPS} loops (projected)", f"{former_projected:.0f}"])
    print(f"analyses of the demo model at {LOOPS} loops, wall seconds per command (process start included)")
    print_table(["command", "seconds"], rows)
    print_measure(
        "former spectral default / new default, 64 loops (projected)", former_projected / seconds["analyze spectral"]
    )
    print_verdict("slowest analysis at 64 loops", max(seconds.values()), GOAL_S, unit=" s", at_most=True)


if __name__ == "__main__":
    main()
