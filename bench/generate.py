"""Generation from a looped LM: cached against uncached, exits and caches at matched quality, cache memory by depth.

On a byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset
trained here for ``--steps`` steps: the stars-lm study's log-normal model, RMSNorm
post-sandwich core of 2 layers, d 64, loops in [1, 16], trained on KJV text and
chain-arithmetic problems answered with the value after every step):

1. **Cache**: tokens/s (median of 3) of greedy generation at a fixed 4 loops with the
   ``per_loop`` cache against recomputing every sequence at every step (``none``), on 8 KJV
   validation windows of 32 bytes continued by 32, and of 128 continued by 128; the two
   paths must produce the same tokens.
2. **Reasoning by real decoding**: ``--problems`` chain-trace problems of each of 1..4
   steps (an n-step answer is n digits and a newline), answered greedily with a depth per
   token; exact match, answer-token accuracy, loops per token and tokens/s (median of 3), for fixed
   depths and the adaptive exits (cap 16), under each cache policy (``last_m`` keeps 2
   loops per token). For each adaptive exit, the cheapest fixed depth whose exact match
   is at least as high, and the tokens/s of the two.
3. **Text**: the teacher-forced loss (nats per byte) of 8 KJV validation passages of 64
   bytes, every byte read at the depth its exit chooses (:func:`looplab.generation.score`).
4. **Memory**: bytes of keys and values held by each policy at 4, 16 and 64 loops
   (batch 8, 32 + 32 tokens).
5. **The retrofit** (SmolLM2-135M as the stars-lm study retrofits it, (4, 6⊗r, 4), W_I =
   [I/2 | I/2], not fine-tuned; skipped with a note when the model is not installed): cached
   against uncached tokens/s at a fixed 4 loops (4 KJV passages of 32 tokens continued by
   16), the teacher-forced KJV loss under each exit and cache, and its cache memory at 4, 16
   and 64 loops.

Goal: the cached path ≥ 2× the uncached one's tokens/s at 128 + 128 bytes. The rest is reported.

    python bench/generate.py [--run-dir RUN] [--steps 800] [--problems 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from lms import smollm2_retrofit, trained_lm
from timing import machine_line, print_measure, print_table, print_verdict, setup

from looplab.experiment import Experiment
from looplab.generation import GenerationExit, generate, score
from looplab.generation.options import DecodeOptions
from looplab.generation.reasoning import decode_answers
from looplab.params import as_dict
from looplab.seeding import derive_generator
from looplab.tasks.corpus import load_corpus
from looplab.tasks.reasoning import ChainTrace
from looplab.tasks.text import BYTE_OFFSET

GOAL = 2.0
CAP = 16
FIXED_DEPTHS = (1, 2, 4, 8)
ADAPTIVE = (
    GenerationExit("kl", CAP, {"eps": 0.01}),
    GenerationExit("convergence", CAP, {"eps": 0.05}),
    GenerationExit("confidence", CAP, {"threshold": 0.9}),
)
CACHES = ("per_loop", "last_m", "shared")
KEEP_LOOPS = 2


def kjv_prompts(exp: Experiment, count: int, length: int) -> list[list[int]]:
    """``count`` validation windows of ``length`` bytes, each after the start token."""
    tokens, _ = exp.task.sample_split(length, count, derive_generator(0, "bench-generate"), "val")
    return [row.tolist() for row in tokens]


def timed(model, prompts, tokens, rule, cache, repeats: int = 3):
    """The generation and its median tokens/s over ``repeats`` runs."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = generate(model, prompts, tokens, DecodeOptions(rule, cache))
        seconds.append(time.perf_counter() - began)
    return result, sum(len(row) for row in result.tokens) / statistics.median(seconds)


def label(rule: GenerationExit) -> str:
    if not rule.adaptive:
        return f"{rule.name} {rule.loops}"
    settings = "".join(f"{key} {value}, " for key, value in as_dict(rule.params).items())
    return f"{rule.name}, {settings}cap {rule.loops}"


def options(rule: GenerationExit, cache: str) -> DecodeOptions:
    """Greedy decoding at ``rule`` through ``cache`` (``last_m`` keeping :data:`KEEP_LOOPS` loops)."""
    return DecodeOptions(rule, cache, cache_params={"keep_loops": KEEP_LOOPS} if cache == "last_m" else None)


def reasoning(model, problems, rule, cache, repeats: int = 3):
    """(decoded answers, median tokens/s over ``repeats`` runs) of greedy answers to ``problems``."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        answers = decode_answers(model, problems, options(rule, cache))
        seconds.append(time.perf_counter() - began)
    return answers, answers.tokens / statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a trained byte-level LM run (default: train the preset here)")
    parser.add_argument("--steps", type=int, default=800, help="training steps when no run is given")
    parser.add_argument("--problems", type=int, default=32, help="chain-trace problems per size, 1..4 steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup(args.threads, 0)
    print(machine_line())
    with tempfile.TemporaryDirectory() as scratch:
        exp = Experiment.from_run(trained_lm(args.run_dir, scratch, args.steps, args.threads))
    model = exp.model
    prompts = kjv_prompts(exp, 8, 32)

    fixed = GenerationExit("fixed", 4)
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

    generator = derive_generator(0, "bench-generate", "trace")
    problems = [p for n in range(1, 5) for p in ChainTrace().draw(n, args.problems, generator)]
    rules = [GenerationExit("fixed", k) for k in FIXED_DEPTHS] + list(ADAPTIVE)
    reasoning(model, problems, rules[0], "per_loop", repeats=1)  # warm-up
    rows, found = [], {}
    for rule in rules:
        for cache in CACHES:
            answers, rate = reasoning(model, problems, rule, cache)
            found[(rule, cache)] = (answers, rate)
            tokens = [right for row in answers.token_correct for right in row]
            rows.append(
                [label(rule), cache, f"{100 * answers.exact_match:.1f}", f"{100 * sum(tokens) / len(tokens):.1f}",
                 f"{answers.mean_depth:.2f}", f"{rate:.0f}"]
            )  # fmt: skip
    print(
        f"2. chain trace, {len(problems)} problems of 1..4 steps (answers of 2..5 tokens), greedy, "
        f"a depth per token; last_m keeps {KEEP_LOOPS} loops"
    )
    print_table(["exit", "cache", "exact match %", "answer tokens %", "loops per token", "tokens/s"], rows)
    print("   matched quality (per_loop): the cheapest fixed depth with at least the adaptive exit's exact match")
    matched = []
    for rule in ADAPTIVE:
        answers, rate = found[(rule, "per_loop")]
        cheapest = next(
            (
                k
                for k in FIXED_DEPTHS
                if found[(GenerationExit("fixed", k), "per_loop")][0].exact_match >= answers.exact_match
            ),
            None,
        )
        if cheapest is None:
            matched.append([label(rule), f"{answers.mean_depth:.2f}", f"{rate:.0f}", "none of " + str(FIXED_DEPTHS)])
            continue
        fixed_rate = found[(GenerationExit("fixed", cheapest), "per_loop")][1]
        matched.append([label(rule), f"{answers.mean_depth:.2f}", f"{rate:.0f}", f"fixed {cheapest}",
                        f"{fixed_rate:.0f}", f"{rate / fixed_rate:.2f}"])  # fmt: skip
    print_table(
        ["adaptive exit", "loops per token", "tokens/s", "matched by", "its tokens/s", "adaptive / fixed"], matched
    )
    kl = found[(ADAPTIVE[0], "per_loop")][0]
    print(f"   by answer position, {label(ADAPTIVE[0])}, per_loop (position i is the value after step i + 1):")
    print_table(
        ["position", "token accuracy %", "loops", "answers"],
        [[p, f"{100 * a:.1f}", f"{d:.2f}", c] for p, a, d, c in kl.by_position()],
    )

    passages = kjv_prompts(exp, 8, 64)
    print("3. KJV validation text, 8 passages of 64 bytes, teacher-forced, each byte at its exit's depth")
    print_table(["exit", "cache", "loss (nats / byte)", "loops per byte"], loss_rows(model, passages, rules))
    memory = memory_rows(model, prompts, 32, 2)
    print("4. keys and values held, MiB (batch 8, 32 + 32 tokens)")
    print_table(MEMORY_HEADER, memory)
    print_measure("per_loop / shared cache memory at 64 loops", float(memory[-1][1]) / float(memory[-1][3]))
    retrofit_ratio = retrofit_section()
    if retrofit_ratio is not None:
        print_measure("retrofit: cached / uncached generation tokens/s, 32 + 16 tokens", retrofit_ratio)
    print_measure("cached / uncached generation tokens/s, 32 + 32 bytes", ratios[32])
    print_verdict("cached / uncached generation tokens/s, 128 + 128 bytes", ratios[128], GOAL)


def loss_rows(model, passages, rules) -> list[list[str]]:
    """(exit, cache, teacher-forced loss, loops per token) of ``passages`` under each rule and cache."""
    rows = []
    for rule in rules:
        for cache in CACHES:
            scored = score(model, passages, options(rule, cache))
            rows.append([label(rule), cache, f"{scored.mean_loss:.3f}", f"{scored.mean_depth:.2f}"])
    return rows


#: the memory table's header: loops, then each cache policy
MEMORY_HEADER = ["loops", *(f"{c} ({KEEP_LOOPS})" if c == "last_m" else c for c in CACHES)]


def memory_rows(model, prompts, new_tokens: int, digits: int) -> list[list]:
    """Per depth 4, 16, 64: the MiB of keys and values each cache policy holds after generating ``new_tokens``."""
    rows = []
    for loops in (4, 16, 64):
        rule = GenerationExit("fixed", loops)
        sizes = [generate(model, prompts, new_tokens, options(rule, c)).cache_bytes / 2**20 for c in CACHES]
        rows.append([loops, *(f"{size:.{digits}f}" for size in sizes)])
    return rows


def retrofit_section() -> float | None:
    """Part 5 (see the module docstring); returns the cached / uncached ratio, or None when skipped."""
    loaded = smollm2_retrofit("5. retrofit")
    if loaded is None:
        return None
    retrofit, tokenizer = loaded
    text = load_corpus().text("val")
    starts = range(0, 4 * 4000, 4000)
    passages = [tokenizer(text[start : start + 400])["input_ids"][:48] for start in starts]
    prompts = [p[:32] for p in passages]
    cached, cached_rate = timed(retrofit, prompts, 16, GenerationExit("fixed", 4), "per_loop", repeats=1)
    uncached, uncached_rate = timed(retrofit, prompts, 16, GenerationExit("fixed", 4), "none", repeats=1)
    assert cached.tokens == uncached.tokens, "the per_loop cache must reproduce recomputation"
    print("5. SmolLM2-135M retrofitted (4, 6⊗r, 4), not fine-tuned: 4 KJV passages of 32 tokens")
    print_table(
        ["fixed 4 loops, + 16 tokens", "per_loop cache", "no cache (recompute)", "ratio"],
        [["tokens/s", f"{cached_rate:.1f}", f"{uncached_rate:.1f}", f"{cached_rate / uncached_rate:.2f}"]],
    )
    rules = (GenerationExit("fixed", 1), GenerationExit("fixed", 4), GenerationExit("convergence", CAP, {"eps": 0.05}))
    print("   KJV passages of 48 tokens, teacher-forced, each token at its exit's depth")
    print_table(["exit", "cache", "loss (nats / token)", "loops per token"], loss_rows(retrofit, passages, rules))
    print("   keys and values held, MiB (batch 4, 32 + 1 tokens)")
    print_table(MEMORY_HEADER, memory_rows(retrofit, prompts, 1, 1))
    return cached_rate / uncached_rate


if __name__ == "__main__":
    main()
