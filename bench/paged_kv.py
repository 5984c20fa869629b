"""What paging the KV cache costs a decode step: the server's continuous batches keep their keys and values in
a pool of 16-slot blocks, and every layer call gathers a row's blocks before attending (a copy a dense cache's
read does not make). Here the same decode steps run with the dense cache and with a paged one, alternately
REPEATS times, the medians compared, on:

- the d 64 byte LM shape (random weights, 4 core layers, 4 loops), and
- the Ouro-1.4B published shape (random weights in the published layout, as bench/published_shapes.py
  writes them), at 4 loops,

in float32 and bfloat16, a batch of 8 rows with every row decoding (a dense cache reads its rows as a view
then: its best case) and with every other row (a server's batch with free rows: a dense cache gathers the
live rows, as a paged one gathers their blocks), prompts of 16 and 512 tokens, ``--new-tokens`` steps timed
after the prefill. Tokens are checked equal between the two. ``RATIO`` lines give paged / dense milliseconds
per step. The prompts' keys and values are random, written into the caches directly (a prefill of 8 × 512
tokens at the Ouro shape would take minutes and is not what is timed); both caches get the same.

    python bench/paged_kv.py [--family d64 ouro] [--dtype float32 bfloat16] [--prompt 16 512] [--new-tokens 4]

About 10 minutes on 2 cores (the Ouro shape in float32 is most of it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from published_shapes import write_random_dir
from timing import machine_line, print_measure, print_table

from looplab.config import ModelConfig
from looplab.generation import GenerationExit
from looplab.generation.cache import kv_shape
from looplab.generation.options import DecodeOptions
from looplab.generation.paged import RESERVED_BLOCKS, BlockPool
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from looplab.lm.dtypes import DTYPES
from looplab.lm.model_dir import open_model_dir
from looplab.model.looped import LoopedTransformer

#: alternated timings of the dense and the paged cache per cell
REPEATS = 3
ROWS, LOOPS = 8, 4


def d64(dtype: torch.dtype):
    """A byte-LM-shaped looplab model (d 64, 4 heads, 4 core layers) with random weights."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_heads=4, core_layers=4, max_len=1024, causal=True)
    return LoopedTransformer(cfg, 256).to(dtype).eval()


def step_ms(
    view, prompts: list[list[int]], new: int, pool: BlockPool | None, every: int = 1
) -> tuple[float, list[list[int]]]:
    """Milliseconds per decode step of every ``every``-th of ``prompts`` (their prefill not timed) and the greedy
    tokens."""
    options = DecodeOptions(GenerationExit("fixed", LOOPS))
    decoder = Decoder(view, prompts, 1 + new, options, pool=pool)
    rows = torch.arange(0, len(prompts), every)
    fill_prompts(decoder, rows)
    chosen, tokens = torch.ones_like(rows), []
    start = time.perf_counter()
    for step in range(new):
        logits, _ = decoder.step(rows, chosen, decoder.width + step, decoder.lengths[rows] + step)
        chosen = logits.argmax(-1)
        tokens.append(chosen.tolist())
    seconds = time.perf_counter() - start
    if pool is not None:
        decoder.cache.release(rows)
    return seconds / new * 1000, tokens


def fill_prompts(decoder: Decoder, rows) -> None:
    """Random keys and values (seeded) in the prompt slots of ``rows`` of every layer call's cache."""
    view, cache, width = decoder.model, decoder.cache, decoder.width
    generator = torch.Generator().manual_seed(0)
    calls = [("prelude", 0, i) for i in range(len(view.prelude))] + [("coda", 0, i) for i in range(len(view.coda))]
    calls += [("core", t, i) for t in range(1, LOOPS + 1) for i in range(len(view.core))]
    cache.reserve(rows, slice(0, width))
    for site, loop, index in calls:
        shape = (len(rows), cache.heads, width, cache.head_dim)
        k, v = (torch.randn(shape, generator=generator).to(cache.dtype) for _ in range(2))
        cache.layer(site, loop, index).write(rows, slice(0, width), k, v, loop)


def compare(model, label: str, prompt: int, new: int, every: int, table: list) -> None:
    """Dense and paged steps of every ``every``-th of ROWS prompts of ``prompt`` tokens, alternated REPEATS times:
    a table row."""
    view = decodable(model)
    heads, head_dim, dtype = kv_shape(view)
    pool = BlockPool(heads, head_dim, dtype, view.head.weight.device)
    per_row = -(-(prompt + new + 1) // pool.slots) * (len(view.prelude) + len(view.coda) + LOOPS * len(view.core))
    pool.grow(RESERVED_BLOCKS + ROWS * per_row)
    vocab = view.head.out_features
    prompts = [[(7 * r + 3 * i) % (vocab - 1) + 1 for i in range(prompt)] for r in range(ROWS)]
    step_ms(view, [p[:4] for p in prompts], 2, None)  # warm-up: one-time costs of a shape
    dense, paged = [], []
    for _ in range(REPEATS):
        ms, dense_tokens = step_ms(view, prompts, new, None, every)
        dense.append(ms)
        ms, paged_tokens = step_ms(view, prompts, new, pool, every)
        paged.append(ms)
    assert paged_tokens == dense_tokens, "the paged cache decoded other tokens"
    ratio = statistics.median(paged) / statistics.median(dense)
    live = f"{ROWS // every} of {ROWS}"
    medians = f"{statistics.median(dense):,.1f}", f"{statistics.median(paged):,.1f}"
    table.append([label, prompt, live, *medians, f"{ratio:.3f}"])
    print_measure(f"paged / dense ms per step, {label}, {live} rows decoding, {prompt}-token prompts", ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=["d64", "ouro"], choices=["d64", "ouro"])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=sorted(DTYPES))
    parser.add_argument("--prompt", type=int, nargs="+", default=[16, 512])
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(machine_line())
    table: list = []
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.family:
            model_dir = open_model_dir(write_random_dir("ouro", Path(scratch) / "ouro")) if family == "ouro" else None
            for name in args.dtype:
                model = d64(DTYPES[name]) if model_dir is None else model_dir.load(DTYPES[name])
                for prompt in args.prompt:
                    for every in (1, 2):
                        compare(model, f"{family} {name}", prompt, args.new_tokens, every, table)
                del model
    print_table(["model", "prompt", "rows", "dense ms/step", "paged ms/step", "paged / dense"], table)


if __name__ == "__main__":
    main()
