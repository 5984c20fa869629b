"""The GPU tier of the benchmarks, one script for a machine with a CUDA device.

1. ``throughput.py`` in bf16 at d = 256 and d = 1024: training tokens/s and the
   achieved TFLOP/s against the device's bf16 matmul peak measured in the same run;
2. ``compaction.py`` and ``eval_grid.py`` on the device (the speed-ups of
   active-set compaction and of the one-unroll evaluation grid);
3. the stopping-paper protocol: the measured time of a training step of each
   config in ``configs/sweeps/stopping-paper.toml`` (bf16), and the projected
   time of the whole protocol (every config × its seeds × ``train.steps``).

Part 3 also runs on a CPU (``--device cpu --only protocol``), which is how the
stopping study's GPU plan scales a CPU measurement. Every part prints its
``RATIO`` lines, so ``bench/all.py``'s table parser reads them too.

    python bench/gpu.py [--device cuda] [--only throughput compaction eval_grid protocol] [--steps 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from throughput import make_trainer
from timing import median, print_measure, print_table, setup, time_interleaved

from looplab.config import PRESETS, load_config
from looplab.sweep import load_sweep

PARTS = ("throughput", "compaction", "eval_grid", "protocol")
HERE = Path(__file__).parent


def run_script(name: str, *args: str) -> None:
    """Run ``bench/<name>.py`` with ``args``, its output shown as it comes."""
    print(f"==== {name} {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args], check=False)


def step_seconds(config, steps: int, warmup: int) -> float:
    """Median seconds of a training step of a fresh experiment built from ``config``."""
    _, run_step = make_trainer(config)
    return median(time_interleaved({"step": run_step}, steps, warmup)["step"])


def protocol_projection(device: str, steps: int, warmup: int) -> None:
    """Time ``steps`` training steps of each stopping-paper config and project the whole protocol."""
    spec = load_sweep(PRESETS / "sweeps" / "stopping-paper.toml")
    seeds = len(spec.seeds)
    rows, total_hours = [], 0.0
    for path in spec.configs:
        overrides = [f"run.device={device}"]
        if device == "cpu":
            overrides.append("run.precision=fp32")
        config = load_config(path, overrides)
        seconds = step_seconds(config, steps, warmup)
        hours = seconds * config.train.steps * seeds / 3600
        total_hours += hours
        rows.append(
            [path.stem, config.run.precision, f"{1e3 * seconds:.1f}", config.train.steps, seeds, f"{hours:.1f}"]
        )
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"stopping-paper protocol on {device}, median of {steps} steps after {warmup} warm-up")
    print_table(["config", "precision", "ms/step", "steps", "seeds", "hours"], rows)
    print_measure(f"stopping-paper protocol on {device}, training only (hours)", total_hours, " h")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="+", choices=PARTS, help="run these parts only")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per stopping-paper config")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    parts = args.only or PARTS
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device on this machine; valid choices: --device cpu --only protocol")
        sys.exit(2)
    setup(2, 0)
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(args.device)}", flush=True)
    common = ["--device", args.device]
    if "throughput" in parts:
        run_script("throughput", *common, "--precision", "bf16", "--d-models", "256", "1024", "--peak-size", "8192")
    if "compaction" in parts:
        run_script("compaction", *common)
    if "eval_grid" in parts:
        run_script("eval_grid", *common)
    if "protocol" in parts:
        protocol_projection(args.device, args.steps, args.warmup)


if __name__ == "__main__":
    main()
