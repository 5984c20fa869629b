"""Which positional scheme extrapolates in length? (the default-choice measurement)

Trains the demo's binary-addition setup (train n ≤ 10, length-matched depth),
or any other preset (``--preset``), once per scheme and seed — ``rope``
(bidirectional), ``nope`` (causal; bidirectional NoPE cannot tell positions
apart) and ``learned`` absolute positions — and prints ID and OOD oracle
accuracy per scheme from the same evaluation.

    python bench/positional.py --seeds 0,1,2
    python bench/positional.py --preset configs/stopping-small/copy-matched.toml --steps 600 --seeds 0,1
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

SCHEMES = {
    "rope": ["model.positional=rope"],
    "causal_nope": ["model.positional=nope", "model.causal=true"],
    "learned": ["model.positional=learned"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, one training per scheme and seed")
    parser.add_argument("--preset", type=Path, default=Path(__file__).resolve().parents[1] / "configs" / "demo.toml")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated subset of the schemes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    preset = args.preset
    print(f"{preset.name}, {args.steps} steps")
    print(f"{'scheme':<14} {'seed':>4} {'oracle ID':>9} {'oracle OOD':>10} {'front@90':>8} {'train s':>7}")
    runs = [(name, SCHEMES[name], int(seed)) for name in args.schemes.split(",") for seed in args.seeds.split(",")]
    for name, overrides, seed in runs:
        config = load_config(preset, overrides + [f"train.steps={args.steps}", f"run.seed={seed}"])
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            exp = train(config, Path(tmp), progress=False)
        seconds = time.perf_counter() - began
        outcomes = evaluate_lengths(
            exp.model,
            exp.task,
            exp.schedule,
            config.task.eval_lengths,
            config.eval.max_loops,
            config.eval.samples,
            config.eval.batch_size,
            config.run.seed,
        )
        s = summarize(outcomes, config.task.train_max)
        print(
            f"{name:<14} {seed:>4} {100 * s['oracle_id']:>8.1f}% {100 * s['oracle_ood']:>9.1f}% {s['front90']:>8} "
            f"{seconds:>7.0f}"
        )


if __name__ == "__main__":
    main()
