"""Halting applied at inference: rows leave the batch when they halt, against every row run to T_max.

An ``act_bce`` model (4×4 Sudoku, 6 blanks, batch 256, T_max = 16 loops in 8 segments of 2) whose
head is set so that rows halt at spread-out segments (its bias centred on the rows' scores at the
second decision). Both paths read the same batch from the same weights; halting-on pays Σᵢ τᵢ loops,
halting-off B × T_max. The answers agree row for row at each row's depth (checked before timing).

Goal: halting-on is faster by at least 0.7 × (T_max / mean halting depth), the loop saving less
the cost of the decisions and the gathers that shrink the batch.
"""

from __future__ import annotations

import argparse

import torch
from timing import add_common_options, add_model_options, median, print_table, print_verdict, setup, time_interleaved

from looplab.config import load_config
from looplab.eval.grid import unroll_outcomes
from looplab.eval.halting_inference import halting_off, halting_on
from looplab.experiment import Experiment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t-max", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    add_model_options(parser)
    add_common_options(parser, repeats=9, warmup=2)
    args = parser.parse_args()
    setup(args.threads, args.seed)

    config = load_config(
        None,
        [
            "task.name=sudoku4",
            "task.train_max=6",
            "task.eval_lengths=[6]",
            "schedule.name=act_bce",
            f"schedule.t_max={args.t_max}",
            "train.segment_loops=2",
            f"model.d_model={args.d_model}",
            f"model.n_heads={args.n_heads}",
            f"model.core_layers={args.layers}",
            f"eval.max_loops={args.t_max}",
            f"run.seed={args.seed}",
        ],
    )
    exp = Experiment.build(config)
    exp.model.eval()
    head = exp.schedule.module.linear
    torch.nn.init.normal_(head.weight, std=3.0)
    torch.nn.init.zeros_(head.bias)
    batch = exp.task.sample(6, args.batch, torch.Generator().manual_seed(args.seed))
    signals = unroll_outcomes(exp.model, batch, args.t_max, exp.schedule)
    head.bias.data[0] -= float(signals["hazard_logits"][:, 3].median())  # about half the rows halt by loop 4
    correct, depth = halting_on(exp.model, exp.schedule, batch, args.t_max)
    reference = unroll_outcomes(exp.model, batch, args.t_max, exp.schedule)["correct"]
    assert torch.equal(correct, reference[torch.arange(args.batch), depth - 1]), "halting-on answers differ"

    paths = {
        "halting on": lambda: halting_on(exp.model, exp.schedule, batch, args.t_max),
        "halting off": lambda: halting_off(exp.model, batch, args.t_max),
    }
    seconds = time_interleaved(paths, args.repeats, args.warmup)
    mean_depth = float(depth.float().mean())
    rows = [
        ["halting on", f"{1000 * median(seconds['halting on']):.1f}", f"{mean_depth:.2f}"],
        ["halting off", f"{1000 * median(seconds['halting off']):.1f}", f"{args.t_max:.2f}"],
    ]
    print(f"act_bce inference, batch {args.batch}, T_max = {args.t_max}, d = {args.d_model}, {args.threads} threads")
    print_table(["path", "ms/batch", "mean loops per row"], rows)
    speedup = median(seconds["halting off"]) / median(seconds["halting on"])
    print_verdict("halting on vs off, inference", speedup, round(0.7 * args.t_max / mean_depth, 2))


if __name__ == "__main__":
    main()
