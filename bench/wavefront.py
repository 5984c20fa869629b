"""Wavefront decoding against the step decoder: tokens/s and core calls per token, fixed and adaptive exits.

Wavefront decoding (:mod:`looplab.generation.wavefront`) runs up to ``front`` positions of a row at once,
each at its own loop, each a guess that greedy decoding checks; its tokens are the step decoder's
(float64 tests), so its quality is greedy decoding's and only its speed is measured here. Each cell
times the step decoder and wavefront decoding at fronts 2, 4 and 8 on the same prompts, interleaved
(median of ``--repeats``), and counts the rows whose tokens are the same (float32: an argmax or a
threshold exit may flip between two batch compositions).

A byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset trained here for
``--steps`` steps: d 64, a 2-layer core, loops in [1, 16]; ``--run-dir`` a run of
``generation/kjv_trace_d256`` for d 256): KJV validation prompts of 64 bytes continued by 64,
batch 1 and 8; fixed 8 loops and the kl exit of bench/depthwise.py (cap 16). (The retrofit has a
coda, which wavefront decoding does not take.)

Goal: wavefront ≥ 1.5× the step decoder's tokens/s at its best front, batch 1, fixed 8.

    python bench/wavefront.py [--run-dir RUN] [--steps 800] [--repeats 3]
"""

from __future__ import annotations

import statistics
import time

import torch
from depthwise import label
from lms import kjv_byte_windows, start_lm_bench
from timing import print_measure, print_table, print_verdict

from looplab.generation import GenerationExit, generate
from looplab.generation.options import DecodeOptions
from looplab.generation.wavefront import WavefrontDecoder

GOAL = 1.5
FRONTS = (2, 4, 8)
EXITS = (GenerationExit("fixed", 8), GenerationExit("kl", 16, {"eps": 0.01}))


def timed(run, repeats: int) -> tuple[object, float]:
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - began)
    return result, statistics.median(seconds)


def main() -> None:
    args, exp = start_lm_bench(__doc__.splitlines()[0])
    windows = kjv_byte_windows(exp, "bench-wavefront")
    model = exp.model.eval()
    rows, best = [], 0.0
    for batch in (1, 8):
        prompts = windows[:batch]
        for rule in EXITS:
            step, step_s = timed(
                lambda p=prompts, r=rule: generate(model, p, 64, DecodeOptions(r, "per_loop")), args.repeats
            )
            count = sum(map(len, step.tokens))
            rows.append([batch, label(rule), "step", f"{step.mean_depth:.2f}", "", f"{count / step_s:.0f}", ""])
            for front in FRONTS:

                def wave(front=front, prompts=prompts, rule=rule):
                    return generate(
                        model,
                        prompts,
                        64,
                        DecodeOptions(rule, "per_loop", decoder="wavefront", decoder_params={"front": front}),
                    )

                result, wave_s = timed(wave, args.repeats)
                same = sum(a == b for a, b in zip(step.tokens, result.tokens))
                ratio = step_s / wave_s
                if batch == 1 and rule.name == "fixed":
                    best = max(best, ratio)
                calls = calls_of(model, prompts, rule, front)
                rows.append(
                    [batch, label(rule), f"wavefront {front}", f"{same}/{batch} same",
                     f"{calls * batch / count:.2f}", f"{count / wave_s:.0f}", f"{ratio:.2f}"]
                )  # fmt: skip
    print(f"byte-level LM (d {exp.model.cfg.d_model}), KJV prompts of 64 bytes + 64, per_loop cache")
    header = ["batch", "exit", "decoder", "mean depth / same rows", "calls per token of a row", "tok/s", "vs step"]
    print_table(header, rows)
    print_measure("byte-level LM, batch 1, fixed 8: wavefront / step tokens/s, best front", best)
    print_verdict("wavefront / step decoder tokens/s, batch 1, fixed 8, best front", best, GOAL)


def calls_of(model, prompts, rule, front: int) -> int:
    """The core calls of one wavefront decode (counted, untimed)."""
    decoder = WavefrontDecoder(model, prompts, 64, DecodeOptions(rule), None, front)
    with torch.no_grad():
        decoder.run()
    return decoder.calls


if __name__ == "__main__":
    main()
