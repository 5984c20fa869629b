"""What the observation hook costs a training step when nothing observes.

Every layer call of :class:`LoopedTransformer` goes through ``_run``, which hands the
call to a hook when :meth:`observe` installed one (the analysis trace records this
way). With no hook installed, that is one attribute test per layer call. This times
the library's training step against the same step with the core's layers called
directly (``direct``: ``step`` rewritten without ``_run``), on the stopping preset's
width at one thread (3 core layers at depth 11: 33 layer calls per forward) and the
STARS toy at 16 loops on two, in one process, interleaved.

Goal: the stock step ≤ 1.02× the direct one (the hook's dispatch is within noise).

    python bench/observe.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import types

from step import stars_toy, stopping_size
from throughput import make_trainer
from timing import add_common_options, median, print_table, print_verdict, setup, time_interleaved

from looplab.config import load_config

GOAL = 1.02
CASES = {
    "stopping size, fixed depth 11, 1 thread": (stopping_size("fixed"), 1),
    "STARS toy, 16 loops, 2 threads": (stars_toy(16, "none"), 2),
}


def direct_step(self, h, e, ctx):
    """``LoopedTransformer.step`` without the hook dispatch."""
    x = self.core_input(h, e)
    for layer in self.core:
        x = layer(x, ctx)
    if self.core_out_norm is not None:
        x = self.core_out_norm(x)
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, repeats=30, warmup=3)
    args = parser.parse_args()
    rows, worst = [], 0.0
    for label, (overrides, threads) in CASES.items():
        setup(threads, args.seed)
        config = load_config(None, [*overrides, f"run.seed={args.seed}"])
        _, stock = make_trainer(config)
        direct_exp, direct = make_trainer(config)
        direct_exp.model.step = types.MethodType(direct_step, direct_exp.model)
        seconds = time_interleaved({"stock": stock, "direct": direct}, args.repeats, args.warmup)
        ratio = median(seconds["stock"]) / median(seconds["direct"])
        worst = max(worst, ratio)
        rows.append(
            [label, f"{1e3 * median(seconds['stock']):.1f}", f"{1e3 * median(seconds['direct']):.1f}", f"{ratio:.3f}"]
        )
    print(f"training step with and without the hook dispatch, median of {args.repeats} interleaved")
    print_table(["case", "stock ms", "direct ms", "stock / direct"], rows)
    print_verdict("stock step / direct layer calls (worst case)", worst, GOAL, at_most=True)


if __name__ == "__main__":
    main()
