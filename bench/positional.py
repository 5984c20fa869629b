"""Which positional scheme extrapolates in length? (the default-choice measurement)

Trains the demo's binary-addition setup (train n ≤ 10, length-matched depth)
once per scheme — ``rope`` (bidirectional), ``nope`` (causal; bidirectional
NoPE cannot tell positions apart) and ``learned`` absolute positions — and
prints ID and OOD oracle accuracy per scheme from the same evaluation.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from looplab.config import load_config
from looplab.eval.grid import evaluate_lengths
from looplab.eval.metrics import summarize
from looplab.train.trainer import train

SCHEMES = {"rope": ["model.positional=rope"], "nope (causal)": ["model.positional=nope", "model.causal=true"],
           "learned": ["model.positional=learned"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    preset = Path(__file__).resolve().parents[1] / "configs" / "demo.toml"
    print(f"{'scheme':<14} {'oracle ID':>9} {'oracle OOD':>10} {'front@90':>8} {'train s':>7}")
    for name, overrides in SCHEMES.items():
        config = load_config(preset, overrides + [f"train.steps={args.steps}", f"run.seed={args.seed}"])
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            exp = train(config, Path(tmp), progress=False)
        seconds = time.perf_counter() - began
        outcomes = evaluate_lengths(exp.model, exp.task, exp.schedule, config.task.eval_lengths,
                                    config.eval.max_loops, config.eval.samples, config.eval.batch_size,
                                    config.run.seed)
        s = summarize(outcomes, config.task.train_max)
        print(f"{name:<14} {100 * s['oracle_id']:>8.1f}% {100 * s['oracle_ood']:>9.1f}% {s['front90']:>8} "
              f"{seconds:>7.0f}")


if __name__ == "__main__":
    main()
