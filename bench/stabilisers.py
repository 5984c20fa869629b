"""Training-step cost of each stabiliser of the stars-stabilisers study, against log-normal loops alone.

Every arm's preset (``configs/stabilisers/decimal_addition-*.toml``) with its penalty on from
the first step, stepped in turn in one process (interleaved, so each arm's k-th timed step
draws the same log-normal depth from the same seed): the median seconds per step, and the
ratio to the ``lognormal`` arm's. The study's own per-step times come from runs that shared
the machine unevenly; these are the ones to quote.

    python bench/stabilisers.py [--repeats 30] [--warmup 3] [--threads 2]
"""

from __future__ import annotations

import argparse

from timing import add_common_options, machine_line, median, print_measure, print_table, setup, time_interleaved

from looplab.cli import PRESETS

ARMS = ("fixed4", "fixed4-jsrr", "lognormal", "stars", "frobenius", "state_l2", "prelude_coda", "contractive")
BASE = "lognormal"


def arm_runner(arm: str, threads: int):
    """The closure that runs the arm's next training step."""
    from looplab.config import load_config
    from looplab.experiment import Experiment
    from looplab.train.trainer import make_optimizer, train_step

    overrides = ["stability.jsrr.warmup=0", "stability.state_l2.warmup=0", f"run.threads={threads}"]
    exp = Experiment.build(load_config(PRESETS / "stabilisers" / f"decimal_addition-{arm}.toml", overrides))
    optimizer = make_optimizer(exp)
    steps = iter(range(1, 1_000_000))
    return lambda: train_step(exp, optimizer, next(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, repeats=30, warmup=3)
    args = parser.parse_args()
    setup(args.threads, 0)
    print(machine_line())
    seconds = time_interleaved({arm: arm_runner(arm, args.threads) for arm in ARMS}, args.repeats, args.warmup)
    base = median(seconds[BASE])
    rows = [[arm, f"{1000 * median(seconds[arm]):.1f}", f"{median(seconds[arm]) / base:.2f}"] for arm in ARMS]
    print(f"training step, 4-digit addition, d 64, batch 64, penalties on from step 1; median of {args.repeats}")
    print_table(["arm", "ms / step", f"vs {BASE}"], rows)
    for arm in ("stars", "frobenius", "state_l2", "contractive"):
        print_measure(f"stabilisers: {arm} / {BASE} step time", median(seconds[arm]) / base)


if __name__ == "__main__":
    main()
