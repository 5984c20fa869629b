"""Cost of the JSRR regulariser: a training step with it vs without, at 16 loops.

The plain step unrolls 16 loops (SDPA) and backpropagates. The regularised
step adds, at the final state, one extra loop linearised once
(``looplab.model.tangent``), one gradient-free power iteration and one
differentiable ‖Jv‖² through that linearisation, then backpropagates through both. The VJP (‖Jᵀv‖²) and
Hutchinson Frobenius estimators are timed too.

The JVP penalty is also timed on a random subset of 16 of the 64 rows
(``stability.jsrr.rows = 16``: the same expected penalty, more variance).

Goal: the JVP step costs ≤ 1.2× the plain step.
"""

from __future__ import annotations

import argparse

from timing import add_common_options, median, print_table, print_verdict, setup, step_runner, time_interleaved

GOAL = 1.2
SUBSET = 16  # stability.jsrr.rows: the penalty on 16 rows of the batch, drawn at random each step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=128)
    add_common_options(parser, repeats=10, warmup=2)
    args = parser.parse_args()
    setup(args.threads, args.seed)

    runs = {}
    for estimator, rows in (("none", 0), ("jvp", 0), ("vjp", 0), ("frobenius", 0), ("jvp", SUBSET)):
        name = estimator if not rows else f"{estimator}, {rows} rows"
        runs[name], _ = step_runner(
            [
                "task.name=binary_addition",
                "task.train_min=8",
                "task.train_max=12",
                "schedule.name=fixed",
                f"schedule.depth={args.loops}",
                f"model.d_model={args.d_model}",
                "model.n_heads=4",
                "model.placement=post_sandwich",
                f"stability.jsrr.estimator={estimator}",
                "stability.jsrr.power_iters=1",
                f"stability.jsrr.rows={rows}",
                "train.batch_size=64",
                f"run.seed={args.seed}",
            ]
        )
    seconds = time_interleaved(runs, args.repeats, args.warmup)

    plain = median(seconds["none"])
    rows = [[name, f"{1000 * median(times):.1f}", f"{median(times) / plain:.2f}x"] for name, times in seconds.items()]
    print(
        f"training step, binary addition n in 8..12, batch 64, {args.loops} loops, d = {args.d_model}, "
        f"{args.threads} threads"
    )
    print_table(["jsrr estimator", "ms/step", "vs plain"], rows)
    print_verdict("jvp step / plain step", median(seconds["jvp"]) / plain, GOAL, at_most=True)
    print_verdict(
        f"jvp step on {SUBSET} of 64 rows / plain step",
        median(seconds[f"jvp, {SUBSET} rows"]) / plain,
        GOAL,
        at_most=True,
    )


if __name__ == "__main__":
    main()
