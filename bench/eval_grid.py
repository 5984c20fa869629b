"""The acc(n, K) grid from one unroll vs one forward pass per K.

Measures the whole evaluation grid for K = 1..30 loops on ``binary_addition``
at lengths 8, 16 and 24 with 256 samples each, for a randomly initialised
model (the cost does not depend on the weights).

- one unroll: :func:`looplab.eval.grid.unroll_outcomes`, which unrolls once
  to 30 loops and reads the answer out after every loop (30 loops, 30 readouts;
  it also computes its confidence and step-ratio signals, which are timed too).
- naive baseline: ``model(tokens, valid, loops=K)`` from scratch for every
  K = 1..30, then whole-answer exact match (Σ K = 465 loops, 30 readouts).

Both must give the same [samples, K] correctness matrix and the same answer
flips between consecutive K (checked before the ratio is printed; the script
also prints how many entries are True, so a trivially all-False check shows).
The ideal ratio is about Σ K / K_max = 15.5 when the readout is cheap.
Goal: one unroll ≥ 10× faster than the naive grid.

The equality check runs each path once before timing and so doubles as the
warm-up; ``--warmup`` adds more untimed rounds.

    python bench/eval_grid.py [--lengths 8 16 24] [--samples 256] [--max-loops 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import os

import torch
from timing import add_common_options, add_model_options, median, print_table, print_verdict, setup, time_interleaved
from torch import Tensor

from looplab.config import Config, validate
from looplab.eval.grid import unroll_outcomes
from looplab.experiment import Experiment
from looplab.model import LoopedTransformer
from looplab.seeding import derive_generator
from looplab.tasks import TaskBatch

GOAL = 10.0


@torch.no_grad()
def naive_outcomes(model: LoopedTransformer, batch: TaskBatch, max_loops: int) -> tuple[Tensor, Tensor]:
    """correct [B, T] and flips [B, T-1] with one full forward pass per K = 1..T.

    The exact-match rule (non-finite logits count as wrong) is the one of
    :func:`unroll_outcomes`.
    """
    answer = batch.answer_mask
    correct, predictions = [], []
    for loops in range(1, max_loops + 1):
        logits = model(batch.tokens, batch.valid, loops)
        finite = torch.isfinite(logits).all(dim=-1)
        prediction = torch.where(finite, logits.argmax(dim=-1), -1)
        correct.append(((prediction == batch.labels) | ~answer).all(dim=1))
        predictions.append(prediction)
    flips = [((after != before) & answer).any(dim=1) for before, after in zip(predictions, predictions[1:])]
    empty = torch.zeros(len(batch.tokens), 0, dtype=torch.bool, device=batch.tokens.device)
    return torch.stack(correct, dim=1), torch.stack(flips, dim=1) if flips else empty


def one_unroll_grid(model: LoopedTransformer, batches: list[TaskBatch], max_loops: int) -> list[tuple[Tensor, Tensor]]:
    """(correct, flips) per batch from the library's one-unroll grid (which also computes its other signals)."""
    outcomes = [unroll_outcomes(model, batch, max_loops) for batch in batches]
    return [(outcome["correct"], outcome["flips"]) for outcome in outcomes]


def naive_grid(model: LoopedTransformer, batches: list[TaskBatch], max_loops: int) -> list[tuple[Tensor, Tensor]]:
    """(correct, flips) per batch with one forward pass per K."""
    return [naive_outcomes(model, batch, max_loops) for batch in batches]


def build(args: argparse.Namespace) -> tuple[LoopedTransformer, list[TaskBatch]]:
    """A randomly initialised model in eval mode and one batch of ``args.samples`` per length."""
    config = Config()
    config.task.name = "binary_addition"
    config.task.eval_lengths = list(args.lengths)
    config.model.d_model, config.model.n_heads, config.model.core_layers = args.d_model, args.n_heads, args.layers
    config.run.seed, config.run.device = args.seed, args.device
    validate(config)
    exp = Experiment.build(config)
    exp.model.eval()
    batches = [
        exp.task.sample(n, args.samples, derive_generator(args.seed, "eval", n)).to(args.device) for n in args.lengths
    ]
    return exp.model, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 16, 24])
    parser.add_argument("--samples", type=int, default=256, help="samples per length (one batch per length)")
    parser.add_argument("--max-loops", type=int, default=30)
    add_model_options(parser)
    add_common_options(parser, repeats=3, warmup=0)
    args = parser.parse_args()
    setup(args.threads, args.seed)

    load_before = os.getloadavg()[0]
    model, batches = build(args)
    fast = one_unroll_grid(model, batches, args.max_loops)
    slow = naive_grid(model, batches, args.max_loops)
    for n, (fast_correct, fast_flips), (slow_correct, slow_flips) in zip(args.lengths, fast, slow):
        assert torch.equal(fast_correct, slow_correct), f"correctness matrices differ at length {n}"
        assert torch.equal(fast_flips, slow_flips), f"flip matrices differ at length {n}"
    true_correct = sum(int(c.sum()) for c, _ in fast)
    true_flips = sum(int(f.sum()) for _, f in fast)

    seconds = time_interleaved(
        {
            "one unroll": lambda: one_unroll_grid(model, batches, args.max_loops),
            "naive (one pass per K)": lambda: naive_grid(model, batches, args.max_loops),
        },
        args.repeats,
        args.warmup,
    )

    cells = len(args.lengths) * args.max_loops
    print(
        f"eval_grid: binary_addition, lengths {args.lengths} x {args.samples} samples, K = 1..{args.max_loops}, "
        f"d_model {args.d_model}, {args.layers} core layers, random init, {args.threads} threads"
    )
    print(
        f"timing: equality check (one untimed grid per path) + {args.warmup} warm-up + {args.repeats} timed grids "
        "per path, interleaved; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        f"check: correctness [{len(args.lengths)} x {args.samples} x {args.max_loops}] and flips identical "
        f"({true_correct} correct entries, {true_flips} flip entries True) -> OK"
    )
    ideal = sum(range(1, args.max_loops + 1)) / args.max_loops
    print(f"work: loops per grid {args.max_loops} vs {sum(range(1, args.max_loops + 1))} (ideal ratio {ideal:.1f}x)")
    rows = [
        [name, f"{median(s):.3f}", f"{min(s):.3f}", f"{max(s):.3f}", f"{1e3 * median(s) / cells:.1f}"]
        for name, s in seconds.items()
    ]
    print_table(["path", "median s/grid", "min s", "max s", "ms per (n, K) cell"], rows)
    print_verdict(
        "naive / one unroll grid time", median(seconds["naive (one pass per K)"]) / median(seconds["one unroll"]), GOAL
    )


if __name__ == "__main__":
    main()
