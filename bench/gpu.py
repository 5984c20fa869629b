"""The GPU tier of the benchmarks, one script for a machine with a CUDA device.

1. ``throughput.py`` in bf16 at d = 256 and d = 1024: training tokens/s and the
   achieved TFLOP/s against the device's bf16 matmul peak measured in the same run;
2. ``compaction.py`` and ``eval_grid.py`` on the device (the speed-ups of
   active-set compaction and of the one-unroll evaluation grid);
3. the paper-scale protocols (``--protocol``, default stopping-paper and
   recursive-paper): the measured time of a training step of each config in
   ``configs/sweeps/<protocol>.toml`` (bf16), and the projected time of the
   whole protocol (every config × its seeds × ``train.steps``).

Part 3 also runs on a CPU (``--device cpu --only protocol``), which is how the
stopping study's GPU plan scales a CPU measurement. ``--batch B`` times every
config at batch B instead and scales the step time by its own batch / B
(linear in the batch: compute-bound steps; the printed table says so), for
configs whose full step would take minutes on a CPU. Every part prints its
``RATIO`` lines, so ``bench/all.py``'s table parser reads them too.

    python bench/gpu.py [--device cuda] [--only throughput compaction eval_grid protocol] [--steps 10]
                        [--protocol stopping-paper recursive-paper] [--batch B]
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


def protocol_projection(protocol: str, device: str, steps: int, warmup: int, batch: int | None = None) -> None:
    """Time ``steps`` training steps of each config of ``configs/sweeps/<protocol>.toml`` and project the
    whole protocol; with ``batch``, time at that batch and scale each step by the config's batch / ``batch``."""
    spec = load_sweep(PRESETS / "sweeps" / f"{protocol}.toml")
    seeds = len(spec.seeds)
    rows, total_hours = [], 0.0
    for path in spec.configs:
        overrides = [f"run.device={device}"]
        if device == "cpu":
            overrides.append("run.precision=fp32")
        full_batch = load_config(path, overrides).train.batch_size
        timed_batch = batch or full_batch
        config = load_config(path, [*overrides, f"train.batch_size={timed_batch}"])
        seconds = step_seconds(config, steps, warmup) * full_batch / timed_batch
        hours = seconds * config.train.steps * seeds / 3600
        total_hours += hours
        rows.append(
            [
                path.stem,
                config.run.precision,
                f"{timed_batch} of {full_batch}",
                f"{1e3 * seconds:.1f}",
                config.train.steps,
                seeds,
                f"{hours:.1f}",
            ]
        )
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    scaled = " (ms/step scaled linearly from the timed batch)" if batch else ""
    print(f"{protocol} protocol on {device}, median of {steps} steps after {warmup} warm-up{scaled}")
    print_table(["config", "precision", "timed batch", "ms/step", "steps", "seeds", "hours"], rows)
    print_measure(f"{protocol} protocol on {device}, training only (hours)", total_hours, " h")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="+", choices=PARTS, help="run these parts only")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per paper-scale config")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--protocol", nargs="+", default=["stopping-paper", "recursive-paper"], help="paper-scale sweeps to project"
    )
    parser.add_argument("--batch", type=int, help="time every config at this batch and scale by its own")
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
        for protocol in args.protocol:
            protocol_projection(protocol, args.device, args.steps, args.warmup, args.batch)


if __name__ == "__main__":
    main()
