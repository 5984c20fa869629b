"""Generation from a looped LM: cached against uncached, adaptive exits against a fixed depth, cache memory by depth.

On a byte-level looped LM of the stars-lm study (``--run-dir``, or the
``stars-lm/post_sandwich-lognormal`` preset trained here for ``--steps`` steps:
RMSNorm post-sandwich core of 2 layers, d 64, log-normal loops in [1, 16]):

1. **Cache**: tokens/s (median of 3) of greedy generation at a fixed 4 loops with the
   ``per_loop`` cache against recomputing every sequence at every step (``none``), on 8 KJV
   validation windows of 32 bytes continued by 32, and of 128 continued by 128; the two
   paths must produce the same tokens.
2. **Exits**: chain-arithmetic problems of 1..4 steps (``--problems`` in all),
   decoded for real (greedy, stopped at the newline that ends an answer), scored
   by exact match of the answer text; the fixed exit at 4 loops against
   ``convergence``, ``kl`` and ``confidence`` capped at 16 loops, with the mean
   loops per token and tokens/s. ``shared`` beside ``per_loop`` at each exit.
3. **Memory**: bytes of keys and values held by each policy at 4, 16 and 64 loops
   (batch 8, 32 + 32 tokens).

Goal: the cached path ≥ 2× the uncached one's tokens/s at 128 + 128 bytes. The rest is reported.

    python bench/generate.py [--run-dir RUN] [--steps 800] [--problems 64]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import machine_line, print_measure, print_table, print_verdict, setup

from looplab.experiment import Experiment
from looplab.generation import ExitRule, Sampling, generate
from looplab.generation.text import cut_at_stop, decode, encode
from looplab.seeding import derive_generator
from looplab.tasks.reasoning import draw_problems
from looplab.tasks.text import BYTE_OFFSET

GOAL = 2.0
PRESET = "stars-lm/post_sandwich-lognormal"


def kjv_prompts(exp: Experiment, count: int, length: int) -> list[list[int]]:
    """``count`` validation windows of ``length`` bytes, each after the start token."""
    tokens, _ = exp.task.sample_split(length, count, derive_generator(0, "bench-generate"), "val")
    return [row.tolist() for row in tokens]


def timed(model, prompts, tokens, rule, cache, repeats: int = 3):
    """The generation and its median tokens/s over ``repeats`` runs."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = generate(model, prompts, tokens, rule, cache)
        seconds.append(time.perf_counter() - began)
    return result, sum(len(row) for row in result.tokens) / statistics.median(seconds)


def arithmetic(model, problems, rule, cache):
    """(exact match, mean depth, tokens/s) of greedy answers to ``problems`` stopped at the newline."""
    prompts = [encode(question) for question, _ in problems]

    def finished(ids):
        return cut_at_stop(decode(ids), ["\n"]) is not None

    began = time.perf_counter()
    result = generate(model, prompts, 4, rule, cache, Sampling(), finished)
    seconds = time.perf_counter() - began
    texts = [cut_at_stop(decode(ids), ["\n"]) or decode(ids) for ids in result.tokens]
    correct = sum(text == answer for text, (_, answer) in zip(texts, problems))
    count = sum(len(row) for row in result.tokens)
    return correct / len(problems), result.mean_depth, count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a trained byte-level LM run (default: train the preset here)")
    parser.add_argument("--steps", type=int, default=800, help="training steps when no run is given")
    parser.add_argument("--problems", type=int, default=64, help="chain-arithmetic problems, 1..4 steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup(args.threads, 0)
    print(machine_line())
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run_dir
        if run_dir is None:
            run_dir = str(Path(scratch) / "lm")
            subprocess.run(
                [sys.executable, "-m", "looplab", "train", PRESET, "--out", run_dir, "--no-progress",
                 "--set", f"train.steps={args.steps}", "--set", f"run.threads={args.threads}"],
                check=True, capture_output=True,
            )  # fmt: skip
        exp = Experiment.from_run(run_dir)
    model = exp.model
    prompts = kjv_prompts(exp, 8, 32)

    fixed = ExitRule("fixed", 4)
    rows, ratios = [], {}
    for length in (32, 128):
        window = kjv_prompts(exp, 8, length)
        cached, cached_rate = timed(model, window, length, fixed, "per_loop")
        uncached, uncached_rate = timed(model, window, length, fixed, "none")
        assert cached.tokens == uncached.tokens, "the per_loop cache must reproduce recomputation"
        ratios[length] = cached_rate / uncached_rate
        rows.append([f"{length} + {length}", f"{cached_rate:.0f}", f"{uncached_rate:.0f}", f"{ratios[length]:.2f}"])
    print("1. KJV continuation, batch 8, fixed 4 loops, tokens/s")
    print_table(["bytes", "per_loop cache", "no cache (recompute)", "ratio"], rows)
    sample = bytes(t - BYTE_OFFSET for t in cached.tokens[0] if t >= BYTE_OFFSET).decode("utf-8", "replace")
    print(f"   e.g. {sample[:60]!r}")

    generator = derive_generator(0, "bench-generate", "arithmetic")
    per = max(1, args.problems // 4)
    problems = [p for n in range(1, 5) for p in draw_problems(n, per, generator)]
    rows = []
    for rule in (
        fixed,
        ExitRule("convergence", 16, eps=0.05),
        ExitRule("kl", 16, eps=0.01),
        ExitRule("confidence", 16, threshold=0.9),
    ):
        for cache in ("per_loop", "shared"):
            accuracy, depth, rate = arithmetic(model, problems, rule, cache)
            label = rule.name if rule.name == "fixed" else f"{rule.name} (cap 16)"
            rows.append([label, cache, f"{100 * accuracy:.1f}", f"{depth:.2f}", f"{rate:.0f}"])
    print(f"2. chain arithmetic, {len(problems)} problems of 1..4 steps, greedy answers decoded to the newline")
    print_table(["exit", "cache", "exact match %", "loops per token", "tokens/s"], rows)

    memory = []
    for loops in (4, 16, 64):
        sizes = [
            generate(model, prompts, 32, ExitRule("fixed", loops), cache).cache_bytes / 2**20
            for cache in ("per_loop", "shared")
        ]
        memory.append([loops, f"{sizes[0]:.2f}", f"{sizes[1]:.2f}"])
    print("3. keys and values held, MiB (batch 8, 32 + 32 tokens)")
    print_table(["loops", "per_loop", "shared"], memory)
    print_measure("per_loop / shared cache memory at 64 loops", float(memory[-1][1]) / float(memory[-1][2]))
    print_measure("cached / uncached generation tokens/s, 32 + 32 bytes", ratios[32])
    print_verdict("cached / uncached generation tokens/s, 128 + 128 bytes", ratios[128], GOAL)


if __name__ == "__main__":
    main()
