"""Masks or gathers: how the step decoder runs a loop that only some of a step's rows still need.

When some tokens of a decode step have exited and others run on, the step decoder
(:mod:`looplab.generation.step`) either gathers the running rows (their states, masks, RoPE tables
and cache rows, a copy each) and scatters their states back, or runs every row of the step and masks
the cache writes of the exited ones (no copies; the exited rows' compute is wasted). It masks while
at least ``MASK_AT`` of the rows run. Each cell times one generation with ``MASK_AT`` forced to
always mask (0), to the rule's value, and to always gather (∞), interleaved (median of ``--repeats``),
and asserts the three give the same tokens.

A byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset trained here for
``--steps`` steps: d 64; ``--run-dir`` a run of ``generation/kjv_trace_d256`` for d 256): KJV
validation prompts of 64 bytes continued by 64, batch 8 and 32, the adaptive exits of
bench/depthwise.py (cap 16), the ``per_loop`` cache.

Goal: the rule's value is within 5 % of the faster of always-mask and always-gather in every cell
(the worst cell's rule / best tokens/s is the measure).

    python bench/row_selection.py [--run-dir RUN] [--steps 800] [--repeats 3]
"""

from __future__ import annotations

import math
import statistics
import time

from depthwise import LM_EXITS, label
from lms import kjv_byte_windows, start_lm_bench
from timing import print_measure, print_table, print_verdict

from looplab.generation import generate, step
from looplab.generation.options import DecodeOptions

GOAL = 0.95


def timed_at(model, prompts, rule, thresholds, repeats: int) -> dict[float, tuple[object, float]]:
    """One generation per ``MASK_AT`` value, interleaved: each one's result and median seconds."""
    chosen = step.MASK_AT
    seconds = {at: [] for at in thresholds}
    results = {}
    try:
        for _ in range(repeats):
            for at in thresholds:
                step.MASK_AT = at
                began = time.perf_counter()
                results[at] = generate(model, prompts, 64, DecodeOptions(rule, "per_loop"))
                seconds[at].append(time.perf_counter() - began)
    finally:
        step.MASK_AT = chosen
    return {at: (results[at], statistics.median(values)) for at, values in seconds.items()}


def main() -> None:
    args, exp = start_lm_bench(__doc__.splitlines()[0])
    windows = kjv_byte_windows(exp, "bench-row-selection")
    thresholds = (0.0, step.MASK_AT, math.inf)
    rows, worst = [], math.inf
    for batch in (8, 32):
        for rule in (r for r in LM_EXITS if r.adaptive):
            timings = timed_at(exp.model, windows[:batch], rule, thresholds, args.repeats)
            reference = timings[0.0][0].tokens
            assert all(result.tokens == reference for result, _ in timings.values()), "masks must not change tokens"
            count = sum(map(len, reference))
            rate = {at: count / s for at, (_, s) in timings.items()}
            ratio = rate[step.MASK_AT] / max(rate[0.0], rate[math.inf])
            worst = min(worst, ratio)
            rows.append(
                [batch, label(rule), f"{timings[0.0][0].mean_depth:.2f}", f"{rate[0.0]:.0f}",
                 f"{rate[step.MASK_AT]:.0f}", f"{rate[math.inf]:.0f}", f"{rate[0.0] / rate[math.inf]:.2f}",
                 f"{ratio:.2f}"]
            )  # fmt: skip
    print(f"byte-level LM (d {exp.model.cfg.d_model}), KJV prompts of 64 bytes + 64, step decoder, per_loop cache")
    print_table(
        ["batch", "exit", "loops per token", "always mask tok/s", f"rule ({step.MASK_AT}) tok/s",
         "always gather tok/s", "mask / gather", "rule / best"], rows,
    )  # fmt: skip
    print_measure("rule / faster of always-mask and always-gather tokens/s, worst cell", worst)
    print_verdict("rule / best row selection tokens/s, worst cell", worst, GOAL)


if __name__ == "__main__":
    main()
