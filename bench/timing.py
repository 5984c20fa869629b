"""Shared helpers for the benchmarks: seeding, interleaved median timing, tables, verdicts.

Both paths of a comparison are timed in the same process and interleaved
(A, B, A, B, ...), so a load spike from anything else on the machine hits both
paths alike instead of biasing the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch


def add_common_options(parser: argparse.ArgumentParser, repeats: int, warmup: int) -> None:
    """Add ``--threads``, ``--seed``, ``--repeats``, ``--warmup`` and ``--device`` to a benchmark's parser."""
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (timings then synchronise the device)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed for torch, numpy and random")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed repeats per path; the median is reported")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed runs per path before timing")


def add_model_options(parser: argparse.ArgumentParser, d_model: int = 64) -> None:
    """Add ``--d-model``, ``--n-heads`` and ``--layers`` (core layers)."""
    parser.add_argument("--d-model", type=int, default=d_model)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2, help="core layers")


def step_runner(overrides: list[str]) -> tuple[Callable[[], None], list[dict]]:
    """Consecutive training steps of the config given by ``overrides``.

    Returns a closure that runs the next step, and the list its metrics are appended to.
    """
    from looplab.config import load_config
    from looplab.experiment import Experiment
    from looplab.train.trainer import make_optimizer, train_step

    exp = Experiment.build(load_config(None, overrides))
    optimizer = make_optimizer(exp)
    steps, metrics = iter(range(1, 1_000_000)), []

    def run() -> None:
        metrics.append(train_step(exp, optimizer, next(steps)))

    return run, metrics


def setup(threads: int, seed: int) -> None:
    """Fix the thread count and seed every random source."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def machine_line() -> str:
    """The machine a benchmark ran on: CPU model, cores, torch threads, torch build and its CPU kernels."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"machine: {model}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({capability} kernels, {torch.get_num_threads()} threads by default)"
    )


def synchronize() -> None:
    """Wait for queued CUDA work (a no-op on CPU), so that a timer measures the work, not its launch."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_interleaved(paths: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each path, ``warmup`` untimed rounds first, then ``repeats`` interleaved rounds."""
    for _ in range(warmup):
        for run in paths.values():
            run()
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, run in paths.items():
            synchronize()
            began = time.perf_counter()
            run()
            synchronize()
            seconds[name].append(time.perf_counter() - began)
    return seconds


def median(values: list[float]) -> float:
    """The median of a list of timings."""
    return statistics.median(values)


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """Print a left-aligned plain-text table."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    print("\n".join(lines))


def print_verdict(label: str, ratio: float, goal: float, unit: str = "x", at_most: bool = False) -> bool:
    """Print the final ``RATIO`` line and whether ``ratio >= goal`` (``ratio <= goal`` with ``at_most``)."""
    met = ratio <= goal if at_most else ratio >= goal
    sign = "<=" if at_most else ">="
    print(f"RATIO {label}: {ratio:.2f}{unit} (goal {sign} {goal:g}{unit}) -> goal {'MET' if met else 'NOT MET'}")
    return met


def print_measure(label: str, value: float, unit: str = "x") -> None:
    """Print a ``RATIO`` line that is reported without a goal."""
    print(f"RATIO {label}: {value:.2f}{unit} (reported, no goal)")
