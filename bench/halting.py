"""RL-Halting step time: sampled-entropy mode with compaction vs the exact-entropy unroll.

Both modes train the same model (binary addition, lengths 1..19, batch 64,
T_max = 20) from the same weights. The ``exact`` mode must unroll every row
to T_max to know all hazards; the ``sampled`` mode stops each row as soon as
it halts, so it pays Σᵢ τᵢ loops instead of B × T_max.

Goal: the sampled mode is ≥ 1.3× faster per step, and its loops per row equal
the mean sampled τ rather than T_max.
"""

from __future__ import annotations

import argparse

from timing import add_common_options, median, print_table, print_verdict, setup, step_runner, time_interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t-max", type=int, default=20)
    parser.add_argument("--d-model", type=int, default=64)
    add_common_options(parser, repeats=15, warmup=3)
    args = parser.parse_args()
    setup(args.threads, args.seed)

    runs, stats = {}, {}
    for mode in ("exact", "sampled"):
        runs[mode], stats[mode] = step_runner(
            [
                "task.name=binary_addition",
                "task.train_min=1",
                "task.train_max=19",
                "schedule.name=rl_halting",
                f"schedule.t_max={args.t_max}",
                f"schedule.entropy_mode={mode}",
                f"model.d_model={args.d_model}",
                "model.core_layers=3",
                "train.batch_size=64",
                f"run.seed={args.seed}",
            ]
        )
    seconds = time_interleaved(runs, args.repeats, args.warmup)

    rows = []
    for mode in ("exact", "sampled"):
        mean = {
            k: sum(s[k] for s in stats[mode]) / len(stats[mode])
            for k in ("block_evals", "row_loops_mean", "halt_depth_mean")
        }
        rows.append(
            [
                mode,
                f"{1000 * median(seconds[mode]):.1f}",
                f"{mean['block_evals']:.2f}",
                f"{mean['row_loops_mean']:.2f}",
                f"{mean['halt_depth_mean']:.2f}",
            ]
        )
    print(f"RL-Halting training step, T_max = {args.t_max}, batch 64, d = {args.d_model}, {args.threads} threads")
    print_table(["mode", "ms/step", "block evals (max τ)", "loops per row", "mean τ"], rows)
    print_verdict("sampled vs exact step time", median(seconds["exact"]) / median(seconds["sampled"]), 1.3)


if __name__ == "__main__":
    main()
