"""Self-speculative decoding against fixed-depth greedy decoding: tokens/s, acceptance, identical tokens.

The draft is the same model at k loops; n drafted tokens are verified at K loops in one batched pass
(:mod:`looplab.generation.speculative`). Each cell times fixed-K greedy decoding (the ``per_loop``
cache) and speculative decoding at (k, n) on the same prompts, interleaved (median of
``--repeats``), and asserts that both give the same tokens.

1. A byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset trained here for
   ``--steps`` steps: d 64, a 2-layer core, loops in [1, 16]; ``--run-dir`` a run of
   ``generation/kjv_trace_d256`` for d 256): KJV validation prompts of 64 bytes
   continued by 64, batch 1, 8 and 32, K = 8 (the other benchmarks' depth) and 16 (the preset's training cap).
2. The SmolLM2-135M retrofit (4, 6⊗r, 4), ``mix``, not fine-tuned (d 576; skipped with a note when
   the model is not installed): KJV prompts of 64 tokens continued by 32, batch 1 and 8, K = 4.

Goal: speculative ≥ 1.5× fixed K's tokens/s at its best (k, n) on one of the two models.

    python bench/speculative.py [--run-dir RUN] [--steps 800] [--repeats 3] [--no-retrofit]
"""

from __future__ import annotations

import statistics
import time

from lms import kjv_byte_windows, kjv_token_windows, smollm2_retrofit, start_lm_bench
from timing import print_measure, print_table, print_verdict

from looplab.generation import GenerationExit, generate
from looplab.generation.speculative import generate_speculative

GOAL = 1.5


def timed(run, repeats: int, *args) -> tuple[object, float]:
    """The result of ``run(*args)`` and its median seconds over ``repeats`` calls."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = run(*args)
        seconds.append(time.perf_counter() - began)
    return result, statistics.median(seconds)


def cells(model, prompts_by_batch, new_tokens: int, grid, repeats: int) -> tuple[list[list], dict[int, float]]:
    """Rows (batch, K, k, n, acceptance, tokens/s fixed, tokens/s speculative, ratio) for ``grid`` {K: [(k, n)]},
    and the best ratio per K."""
    rows, best = [], dict.fromkeys(grid, 0.0)
    for batch, prompts in prompts_by_batch.items():
        for loops, pairs in grid.items():
            fixed, fixed_s = timed(generate, repeats, model, prompts, new_tokens, GenerationExit("fixed", loops))
            count = sum(map(len, fixed.tokens))
            for k, n in pairs:
                fast, fast_s = timed(generate_speculative, repeats, model, prompts, new_tokens, loops, k, n)
                assert fast.tokens == fixed.tokens, f"speculative ({k}, {n}) must give fixed {loops}'s tokens"
                ratio = fixed_s / fast_s
                best[loops] = max(best[loops], ratio)
                rows.append(
                    [batch, loops, k, n, f"{100 * fast.acceptance:.1f}", f"{count / fixed_s:.0f}",
                     f"{count / fast_s:.0f}", f"{ratio:.2f}"]
                )  # fmt: skip
    return rows, best


HEADER = ["batch", "K", "draft loops k", "draft tokens n", "acceptance %", "fixed K tok/s", "speculative tok/s",
          "ratio"]  # fmt: skip
#: the byte-level LM's (k, n) per K: K = 8 (the benchmarks' depth), and K = 16 (its training cap)
LM_GRID = {8: [(1, 4), (2, 4), (2, 8), (4, 4)], 16: [(4, 4), (4, 8), (8, 4)]}


def main() -> None:
    args, exp = start_lm_bench(__doc__.splitlines()[0])
    windows = kjv_byte_windows(exp, "bench-speculative")
    prompts = {batch: windows[:batch] for batch in (1, 8, 32)}
    rows, best_lm = cells(exp.model, prompts, 64, LM_GRID, args.repeats)
    print(f"1. byte-level LM (d {exp.model.cfg.d_model}), KJV prompts of 64 bytes + 64, K = 8 and 16")
    print_table(HEADER, rows)
    best_retrofit = None if args.no_retrofit else retrofit_section(args.repeats)
    for loops, ratio in best_lm.items():
        print_measure(f"byte-level LM: speculative / fixed {loops} tokens/s, best (k, n)", ratio)
    best = max(best_lm.values()) if best_retrofit is None else max(*best_lm.values(), best_retrofit)
    if best_retrofit is not None:
        print_measure("SmolLM2 retrofit: speculative / fixed 4 tokens/s, best (k, n)", best_retrofit)
    print_verdict("speculative / fixed-K tokens/s, best model and (k, n)", best, GOAL)


def retrofit_section(repeats: int) -> float | None:
    """Part 2 (see the module docstring); the best ratio, or None when SmolLM2 is not installed."""
    loaded = smollm2_retrofit("2. retrofit")
    if loaded is None:
        return None
    retrofit, windows = loaded[0], kjv_token_windows(loaded[1])
    grid = {4: [(1, 4), (2, 4), (2, 2)]}
    rows, best = cells(retrofit, {1: windows[:1], 8: windows}, 32, grid, max(1, repeats - 2))
    print("2. SmolLM2-135M retrofit (4, 6⊗r, 4), d 576, KJV prompts of 64 tokens + 32, K = 4")
    print_table(HEADER, rows)
    return best[4]


if __name__ == "__main__":
    main()
