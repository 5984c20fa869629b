"""Depth-wise batching against the step-synchronous decoder: tokens/s of adaptive exits and of fixed depths.

The step decoder runs a decode step's loops until its deepest token exits; depth-wise batching
(:mod:`looplab.generation.depthwise`) advances every running row by one loop of its own token per
core call. Each cell times both on the same prompts, interleaved (median of ``--repeats``), with the
``per_loop`` cache, and counts the rows whose tokens are the same (float32: a threshold exit may flip
where a row's batch-mates differ, as between any two batch compositions).

1. A byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset trained here for
   ``--steps`` steps: d 64, a 2-layer core, loops in [1, 16]; ``--run-dir`` a run of
   ``generation/kjv_trace_d256`` for d 256): KJV validation prompts of 64 bytes
   continued by 64, batch 1, 8 and 32; the exits of bench/generate.py (cap 16) and fixed 4.
2. The SmolLM2-135M retrofit (4, 6⊗r, 4), ``mix``, not fine-tuned (d 576; skipped with a note when the
   model is not installed): KJV prompts of 64 tokens continued by 32, batch 1 and 8; the convergence
   exit (cap 8) and fixed 4.

Each row gives both decoders' tokens/s, their ratio, and the depth-wise path against fixed 4 loops
on the step decoder.

3. Matched quality on the byte-level LM, batch 8: each exit's teacher-forced loss on 8 KJV validation
   passages (64 bytes of context, the next 64 scored; depth-wise tokens are the step decoder's, so is
   their loss), the cheapest fixed depth whose loss is within 0.01 nats of it, and the adaptive exit's
   depth-wise tokens/s against that depth's step tokens/s (the issue's 1.5× test).

4. Across requests, byte-level LM: 64 chain-trace problems (16 of each of 1..4 steps; answers of 2..5
   tokens, each row done at its newline), kl exit (cap 16): the step decoder on them 8 at a time, one
   batch after another, against depth-wise batching with ``max_batch`` 8 (a waiting problem takes the
   row of the next one to finish); problems/s and the answers both give.

5. Matched exact match on the byte-level LM, 8 rows: the 64 problems of part 4 at each fixed depth
   and under each adaptive exit, each run three ways (the step decoder 8 at a time, depth-wise with
   ``max_batch`` 8, and wavefront decoding 8 at a time with 8 positions in flight per row); the cheapest
   fixed depth whose exact match (the least of its ways) is at least the exit's, and the exit's problems/s
   against that depth's, each at its fastest way (the issue's other 1.5× test).

Goal: depth-wise ≥ the step decoder's tokens/s for an adaptive exit at batch 8 on one of the two
models. The rest is reported.

    python bench/depthwise.py [--run-dir RUN] [--steps 800] [--repeats 3] [--no-retrofit]
"""

from __future__ import annotations

import statistics
import time

import torch
from lms import kjv_byte_windows, kjv_token_windows, smollm2_retrofit, start_lm_bench
from timing import print_measure, print_table, print_verdict

from looplab.generation import GenerationExit, generate, score
from looplab.generation.byte_text import decode, encode
from looplab.generation.options import DecodeOptions
from looplab.generation.text import cut_at_stop
from looplab.seeding import derive_generator
from looplab.tasks.reasoning import ANSWER_END, ChainTrace

GOAL = 1.0
BASELINE = GenerationExit("fixed", 4)
LM_EXITS = (
    GenerationExit("kl", 16, {"eps": 0.01}),
    GenerationExit("convergence", 16, {"eps": 0.05}),
    GenerationExit("confidence", 16, {"threshold": 0.9}),
    BASELINE,
)
RETROFIT_EXITS = (GenerationExit("convergence", 8, {"eps": 0.05}), BASELINE)
FIXED_DEPTHS = (1, 2, 3, 4, 6, 8, 16)
#: the positions in flight per row of part 5's wavefront decoding
WAVEFRONT = 8
#: how much worse (nats per token) an adaptive exit's loss may be than a fixed depth's that "matches" it
LOSS_MARGIN = 0.01
HEADER = ["batch", "exit", "mean depth", "same rows", "step tok/s", "depth-wise tok/s", "ratio", "vs fixed 4 step"]


def label(rule: GenerationExit) -> str:
    params = ",".join(f"{k}={v}" for k, v in vars(rule.params).items()) if rule.params is not None else ""
    return f"{rule.name} {rule.loops}" + (f" ({params})" if params else "")


def timed(model, prompts, new_tokens: int, rule: GenerationExit, repeats: int) -> dict:
    """Both decoders on the same prompts, interleaved: their generations and median seconds."""
    seconds = {"step": [], "depth": []}
    results = {}
    for _ in range(repeats):
        for batching in ("step", "depth"):
            began = time.perf_counter()
            results[batching] = generate(model, prompts, new_tokens, DecodeOptions(rule, "per_loop", decoder=batching))
            seconds[batching].append(time.perf_counter() - began)
    return {k: (results[k], statistics.median(v)) for k, v in seconds.items()}


def cells(model, prompts_by_batch, new_tokens: int, rules, repeats: int) -> tuple[list[list], dict]:
    """Table rows and, per (batch, exit name), depth-wise / step tokens/s."""
    rows, ratios = [], {}
    for batch, prompts in prompts_by_batch.items():
        base_result, base_s = timed(model, prompts, new_tokens, BASELINE, repeats)["step"]
        base_rate = sum(map(len, base_result.tokens)) / base_s
        for rule in rules:
            timings = timed(model, prompts, new_tokens, rule, repeats)
            (step, step_s), (depth, depth_s) = timings["step"], timings["depth"]
            same = sum(a == b for a, b in zip(step.tokens, depth.tokens))
            count = sum(map(len, depth.tokens))
            ratios[batch, rule.name] = step_s / depth_s
            rows.append(
                [batch, label(rule), f"{depth.mean_depth:.2f}", f"{same}/{len(prompts)}",
                 f"{sum(map(len, step.tokens)) / step_s:.0f}", f"{count / depth_s:.0f}", f"{step_s / depth_s:.2f}",
                 f"{count / depth_s / base_rate:.2f}"]
            )  # fmt: skip
    return rows, ratios


def main() -> None:
    args, exp = start_lm_bench(__doc__.splitlines()[0])
    windows = kjv_byte_windows(exp, "bench-depthwise")
    rows, ratios = cells(exp.model, {batch: windows[:batch] for batch in (1, 8, 32)}, 64, LM_EXITS, args.repeats)
    print(f"1. byte-level LM (d {exp.model.cfg.d_model}), KJV prompts of 64 bytes + 64, per_loop cache")
    print_table(HEADER, rows)
    best = max(ratios[8, rule.name] for rule in LM_EXITS if rule.adaptive)
    print_measure("byte-level LM, batch 8: depth-wise / step tokens/s, best adaptive exit", best)
    matched = matched_section(exp, windows[:8], args.repeats)
    print_measure("byte-level LM, batch 8: depth-wise adaptive / matched fixed depth tokens/s, best exit", matched)
    queued = requests_section(exp, args.repeats)
    print_measure("byte-level LM, 64 problems, 8 rows: depth-wise with waiting prompts / step in batches", queued)
    traced = matched_trace_section(exp, args.repeats)
    print_measure("byte-level LM, 64 problems, 8 rows: adaptive / matched fixed depth problems/s, best exit", traced)
    retrofit = None if args.no_retrofit else retrofit_section(args.repeats)
    if retrofit is not None:
        print_measure("SmolLM2 retrofit, batch 8: depth-wise / step tokens/s, convergence exit", retrofit)
        best = max(best, retrofit)
    print_verdict("depth-wise / step tokens/s of an adaptive exit at batch 8, best model", best, GOAL)


def matched_section(exp, prompts, repeats: int) -> float:
    """Part 3 (see the module docstring); the best adaptive / matched fixed tokens/s ratio."""
    passages = kjv_byte_windows(exp, "bench-depthwise-loss", 8, 127)

    def loss(rule):
        return score(exp.model, passages, DecodeOptions(rule, "per_loop"), 64).mean_loss

    def rate(rule, batching):
        seconds = []
        for _ in range(repeats):
            began = time.perf_counter()
            result = generate(exp.model, prompts, 64, DecodeOptions(rule, "per_loop", decoder=batching))
            seconds.append(time.perf_counter() - began)
        return sum(map(len, result.tokens)) / statistics.median(seconds), result.mean_depth

    fixed = {k: (loss(GenerationExit("fixed", k)), rate(GenerationExit("fixed", k), "step")[0]) for k in FIXED_DEPTHS}
    rows, best = [], 0.0
    for rule in (r for r in LM_EXITS if r.adaptive):
        own, (fast, depth) = loss(rule), rate(rule, "depth")
        cheapest = next((k for k in FIXED_DEPTHS if fixed[k][0] <= own + LOSS_MARGIN), None)
        if cheapest is None:
            rows.append([label(rule), f"{own:.4f}", f"{depth:.2f}", f"{fast:.0f}", f"none of {FIXED_DEPTHS}", "", ""])
            continue
        ratio = fast / fixed[cheapest][1]
        best = max(best, ratio)
        rows.append([label(rule), f"{own:.4f}", f"{depth:.2f}", f"{fast:.0f}", f"fixed {cheapest}",
                     f"{fixed[cheapest][0]:.4f}, {fixed[cheapest][1]:.0f}", f"{ratio:.2f}"])  # fmt: skip
    print("3. matched quality, byte-level LM, batch 8: teacher-forced KJV loss (64 + 64 bytes) and tokens/s")
    print_table(["fixed depth", "loss (nats / byte)", "step tok/s"],
                [[k, f"{v[0]:.4f}", f"{v[1]:.0f}"] for k, v in fixed.items()])  # fmt: skip
    print_table(
        ["adaptive exit", "loss", "loops per token", "depth-wise tok/s", f"matched by (loss ≤ +{LOSS_MARGIN})",
         "its loss, step tok/s", "adaptive / fixed"], rows,
    )  # fmt: skip
    return best


def trace_problems() -> list[tuple[str, str]]:
    """The 64 chain-trace problems of parts 4 and 5 (16 of each of 1..4 steps), in a seeded mixed order."""
    generator = derive_generator(0, "bench-depthwise", "trace")
    problems = [p for n in range(1, 5) for p in ChainTrace().draw(n, 16, generator)]
    order = torch.randperm(len(problems), generator=derive_generator(0, "bench-depthwise", "order")).tolist()
    return [problems[i] for i in order]  # sizes mixed, so rows finish at different times


def solve(
    exp, problems, rule: GenerationExit, rows: int, repeats: int, wavefront: bool = False
) -> dict[str, tuple[float, int, float]]:
    """The problems under ``rule`` by the step decoder ``rows`` at a time, depth-wise with ``max_batch`` ``rows``
    and (``wavefront``) by wavefront decoding ``rows`` at a time, interleaved: per way, (problems/s from the
    median seconds, exact matches, loops per token)."""
    prompts = [encode(question) for question, _ in problems]
    longest = max(len(answer) for _, answer in problems)

    def finished(ids: list[int]) -> bool:
        return cut_at_stop(decode(ids), [ANSWER_END]) is not None

    def in_batches(decoder: str = "step", **params):
        options = DecodeOptions(rule, decoder=decoder, decoder_params=params)
        return [generate(exp.model, prompts[i : i + rows], longest, options, finished)
                for i in range(0, len(prompts), rows)]  # fmt: skip

    def queued():
        return [
            generate(
                exp.model,
                prompts,
                longest,
                DecodeOptions(rule, decoder="depth", decoder_params={"max_batch": rows}),
                finished,
            )
        ]

    ways = [("step", in_batches), ("depth", queued)]
    if wavefront:
        ways.append(("wavefront", lambda: in_batches("wavefront", front=WAVEFRONT)))
    seconds, right, depth = {name: [] for name, _ in ways}, {}, {}
    for _ in range(repeats):
        for name, run in ways:
            began = time.perf_counter()
            parts = run()
            seconds[name].append(time.perf_counter() - began)
            texts = [cut_at_stop(decode(ids), [ANSWER_END]) for part in parts for ids in part.tokens]
            right[name] = sum(text == answer for text, (_, answer) in zip(texts, problems))
            depths = [d for part in parts for row in part.depths for d in row]
            depth[name] = sum(depths) / len(depths)
    return {name: (len(problems) / statistics.median(seconds[name]), right[name], depth[name]) for name in seconds}


def requests_section(exp, repeats: int, rows: int = 8) -> float:
    """Part 4 (see the module docstring); depth-wise with waiting prompts / step in batches, problems/s."""
    problems, rule = trace_problems(), LM_EXITS[0]
    solved = solve(exp, problems, rule, rows, repeats)
    rates = {name: rate for name, (rate, _, _) in solved.items()}
    right = {name: count for name, (_, count, _) in solved.items()}
    print(f"4. across requests: {len(problems)} chain-trace problems (1..4 steps), {label(rule)}, {rows} rows")
    print_table(
        ["decoder", "problems/s", "exact match"],
        [[f"step, batches of {rows}", f"{rates['step']:.1f}", f"{right['step']}/{len(problems)}"],
         [f"depth-wise, max_batch {rows}", f"{rates['depth']:.1f}", f"{right['depth']}/{len(problems)}"]],
    )  # fmt: skip
    return rates["depth"] / rates["step"]


def matched_trace_section(exp, repeats: int, rows: int = 8) -> float:
    """Part 5 (see the module docstring); the best adaptive / matched fixed problems/s ratio (0 when no fixed
    depth matches)."""
    problems = trace_problems()
    fixed = {k: solve(exp, problems, GenerationExit("fixed", k), rows, repeats, True) for k in FIXED_DEPTHS}

    def line(name, runs):
        right = min(count for _, count, _ in runs.values())
        return [name, f"{right}/{len(problems)}", *(f"{runs[way][0]:.1f}" for way in ("step", "depth", "wavefront"))]

    table = [line(f"fixed {k}", runs) for k, runs in fixed.items()]
    rows_out, best = [], 0.0
    for rule in (r for r in LM_EXITS if r.adaptive):
        runs = solve(exp, problems, rule, rows, repeats, True)
        right = min(count for _, count, _ in runs.values())
        rate = max(rate for rate, _, _ in runs.values())
        table.append(line(label(rule), runs))
        cheapest = next((k for k in FIXED_DEPTHS if min(c for _, c, _ in fixed[k].values()) >= right), None)
        if cheapest is None:
            rows_out.append([label(rule), f"{runs['depth'][2]:.2f}", f"none of {FIXED_DEPTHS}", ""])
            continue
        ratio = rate / max(rate for rate, _, _ in fixed[cheapest].values())
        best = max(best, ratio)
        rows_out.append([label(rule), f"{runs['depth'][2]:.2f}", f"fixed {cheapest}", f"{ratio:.2f}"])
    print(f"5. matched exact match: the {len(problems)} problems of part 4, {rows} rows, problems/s")
    ways = [f"step, batches of {rows}", f"depth-wise, max_batch {rows}", f"wavefront {WAVEFRONT}, batches of {rows}"]
    print_table(["exit", "exact match", *ways], table)
    print_table(["adaptive exit", "loops per token", "matched by (exact match ≥)", "adaptive / fixed, faster ways"],
                rows_out)  # fmt: skip
    return best


def retrofit_section(repeats: int) -> float | None:
    """Part 2 (see the module docstring); the batch-8 ratio, or None when SmolLM2 is not installed."""
    loaded = smollm2_retrofit("2. retrofit")
    if loaded is None:
        return None
    retrofit, windows = loaded[0], kjv_token_windows(loaded[1])
    rows, ratios = cells(retrofit, {1: windows[:1], 8: windows}, 32, RETROFIT_EXITS, max(1, repeats - 2))
    print("2. SmolLM2-135M retrofit (4, 6⊗r, 4), d 576, KJV prompts of 64 tokens + 32, per_loop cache")
    print_table(HEADER, rows)
    return ratios[8, "convergence"]


if __name__ == "__main__":
    main()
