"""What Ouro, Huginn-0125, Nanbeige4.2-3B and Parcae-770M cost at their published shapes, with random weights
(no weights can be downloaded here), against this machine's limit: each family's published config
(tests/data/reference_configs) is written as a model dir of random weights, then, for each ``--dtype``
(float32 and bfloat16) and int8 weights (``--weights int8``, float32 activations):

- the memory bandwidth, measured as a large matrix–vector product reads its matrix (GB/s, per dtype);
- load: the seconds ``open_model_dir(...).load`` takes, and the process's peak resident memory after it;
- decode at batch 1 with the ``per_loop`` cache, per prompt length (``--prompt``) and loop count (Ouro 1 and 4,
  Huginn its native 32, Nanbeige 1 and 2, Parcae its native 8): ms per new token (the step decoder's steps after
  the prompt's prefill, timed alone), tokens/s, and the fraction of the bandwidth bound reached — bytes read per
  token (the weights of every layer a token runs, the looped ones once per loop, the head once, and the keys and
  values attended to) ÷ bandwidth, over the measured time;
- Ouro: transformers' ``LlamaForCausalLM`` with the same 24 layers, width and heads in the same dtype, its
  ms per new token beside (one pass of the layers: looplab at 1 loop does the same work), both loaded and
  timed alternately REPEATS times, the medians compared;
- int8: the quality cost (max |Δ logit| and greedy agreement over 64 random tokens at the native loops,
  against float32) and its speed against float32;
- Ouro: tokens/s with its ``gate`` exit at τ 0.5 against every loop (read-only), and recomputing the
  sequence (``--cache none``) against the cache, at the native loops;
- KV memory per 1K tokens at 4, 8 and 16 loops for each cache policy (the decoder's own allocation).

    python bench/published_shapes.py [--family ouro huginn nanbeige parcae] [--dtype float32 bfloat16] [--prompt 16]

About 30 minutes on 2 cores for the default Ouro and Huginn (Huginn's 3.5 B parameters at 32 recurrences in
float32 are the most of it); Nanbeige (4.2 B parameters, 16.7 GB in float32) and Parcae-770M are asked for
by ``--family``;
``RATIO`` lines give the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from timing import machine_line, print_measure, print_table

from looplab.generation import GenerationExit, generate
from looplab.generation.options import DecodeOptions
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from looplab.lm.dtypes import DTYPES
from looplab.lm.families import LOOPED_FAMILIES
from looplab.lm.int8 import int8_quality
from looplab.lm.model_dir import open_model_dir

CONFIGS = Path(__file__).parent.parent / "tests" / "data" / "reference_configs"
FILES = {
    "ouro": "ouro-1.4b_config.json",
    "huginn": "huginn-0125_raven_config_minimal.json",
    "nanbeige": "nanbeige4.2-3b_config.json",
    "parcae": "parcae-770m_config.json",
}
#: loop counts decoded: Ouro at 1 (the same work as one pass of a Llama) and its native 4, Huginn at its
#: native 32 recurrences, Nanbeige at 1 and its native 2, Parcae-770M at its native 8
LOOPS = {"ouro": (1, 4), "huginn": (32,), "nanbeige": (1, 2), "parcae": (8,)}
#: parameters run once per loop: the core layers, and Huginn's and Parcae's injections and Ouro's exit gate
LOOPED_PREFIXES = ("core.", "adapter.", "injection.", "gate.")
#: tables of which a token reads one row: an untied embedding, Parcae's value embeddings
ROW_TABLES = ("embed", "value_embeds.")
GB = 1e9
#: alternated timings of looplab and Llama per comparison
REPEATS = 5


def write_random_dir(family: str, folder: Path) -> Path:
    """The published config and random bfloat16 weights under the published names, with a tiny tokenizer."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    raw = json.loads((CONFIGS / FILES[family]).read_text())
    record = LOOPED_FAMILIES[raw.get("model_type", family)]
    config = record.config_reader(raw, FILES[family])
    with torch.device("meta"):
        model = record.model(config)
    generator = torch.Generator().manual_seed(0)
    weights = {}
    for name, parameter in model.state_dict().items():
        if name == "lm_head.weight" and family in ("huginn", "parcae"):
            continue  # tied to the embedding: not stored
        value = torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * 0.02
        if "norm" in name:  # RMSNorm weights about 1
            value = value + 1.0
        weights[name] = value.to(torch.bfloat16)
    folder.mkdir(parents=True)
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(raw))
    vocab = {f"t{i}": i for i in range(256)}  # the benchmark feeds token ids; the dir needs some tokenizer
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0").save_pretrained(folder)
    return folder


def bandwidth(dtype: torch.dtype, size: int = 8192, repeats: int = 20) -> float:
    """GB/s at which a matrix–vector product reads a ``size`` × ``size`` matrix of ``dtype`` (the best mean
    of three rounds): the rate a batch-1 decode reads its weights at, at best."""
    matrix, vector = torch.randn(size, size).to(dtype), torch.randn(size).to(dtype)
    best = float("inf")
    for _ in range(3):
        matrix @ vector
        start = time.perf_counter()
        for _ in range(repeats):
            matrix @ vector
        best = min(best, (time.perf_counter() - start) / repeats)
    return matrix.numel() * matrix.element_size() / best / GB


def bytes_per_token(loop, loops: int, context: int, layers: int, kv_heads: int, head_dim: int) -> int:
    """Bytes a decode step reads at ``loops`` loops over ``context`` tokens: the looped parameters and
    buffers (int8 weights at one byte) once per loop, the rest but the tables a token reads a row of once (a
    tied head reads the embedding), and the keys and values of the ``layers`` core layers per loop."""
    looped, once = 0, 0
    named = [*loop.named_parameters(), *loop.named_buffers()]
    tied = not any(name.startswith("lm_head") for name, _ in named)
    for name, tensor in named:
        size = tensor.numel() * tensor.element_size()
        if name.startswith(LOOPED_PREFIXES):
            looped += size
        elif not name.startswith(ROW_TABLES) or (tied and name.startswith("embed")):
            once += size  # of an untied embedding or a value embedding, a token reads one row
    element = next(loop.parameters()).element_size()
    kv = 2 * context * kv_heads * head_dim * element * layers
    return loops * (looped + kv) + once


@torch.no_grad()
def ms_per_token(
    model, prompt: list[int], loops: int, new: int, rule: GenerationExit | None = None, **params
) -> tuple[float, list[int]]:
    """Milliseconds per new token of the step decoder with the ``per_loop`` cache, timed over ``new`` decode
    steps after the prompt's prefill (which is not timed), and the depths of those steps' tokens."""
    rule = rule or GenerationExit("fixed", loops)
    options = DecodeOptions(rule, "per_loop", decoder_params=params)
    view = decodable(model, gated=rule.needs_gate)
    generate(model, [prompt[:2]], 2, options)  # warm-up: the first call of a shape pays one-time costs
    decoder = Decoder(view, [prompt], 1 + new, options)
    rows = torch.arange(1)
    logits, depths = decoder.prefill(rows)
    seen = []
    start = time.perf_counter()
    for step in range(new):
        token = logits.argmax(-1)
        logits, depths = decoder.step(rows, token, decoder.width + step, decoder.lengths + step)
        seen.append(int(depths[0]))
    return (time.perf_counter() - start) / new * 1000, seen


def recompute_ms_per_token(model, prompt: list[int], loops: int, new: int) -> float:
    """Milliseconds per new token recomputing the whole sequence (``--cache none``): a generation of 1 + ``new``
    less one of 1 (the prompt costs little beside the tokens' recomputation)."""
    options = DecodeOptions(GenerationExit("fixed", loops), "none")
    generate(model, [prompt[:2]], 2, options)
    start = time.perf_counter()
    generate(model, [prompt], 1, options)
    first = time.perf_counter() - start
    start = time.perf_counter()
    generate(model, [prompt], 1 + new, options)
    return (time.perf_counter() - start - first) / new * 1000


def llama_like(raw: dict, dtype: torch.dtype):
    """transformers' LlamaForCausalLM with Ouro's layers, width, heads, vocabulary and RoPE, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw["num_key_value_heads"], rope_theta=raw.get("rope_theta", 10000.0),
        max_position_embeddings=raw["max_position_embeddings"],
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    return model.eval()


@torch.no_grad()
def llama_ms_per_token(model, prompt: list[int], new: int) -> float:
    """Milliseconds per greedy new token of a transformers causal LM with its own KV cache, timed over ``new``
    steps after the prompt's forward (not timed), as :func:`ms_per_token` times looplab's."""

    def steps(ids: torch.Tensor, count: int) -> float:
        out = model(ids, use_cache=True)
        start = time.perf_counter()
        for _ in range(count):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
        return time.perf_counter() - start

    steps(torch.tensor([prompt[:2]]), 2)  # warm-up
    return steps(torch.tensor([prompt]), new) / new * 1000


def compare_with_llama(loop, raw: dict, dtype, weights: str, prompts: list[int], new: int, table: list) -> None:
    """Ouro at 1 loop beside transformers' Llama with the same layers, both loaded: each timed REPEATS times,
    alternately (a drift in the machine's speed falls on both), their medians compared."""
    llama = llama_like(raw, dtype)
    for length in prompts:
        prompt = list(range(1, length + 1))
        ours, theirs = [], []
        for _ in range(REPEATS):
            ours.append(ms_per_token(loop, prompt, 1, new)[0])
            theirs.append(llama_ms_per_token(llama, prompt, new))
        mine, ms = statistics.median(ours), statistics.median(theirs)
        _row(table, ["ouro (looplab, alternated)", weights, length, 1, f"{mine:,.0f}", f"{1000 / mine:.3f}", "", ""])
        _row(table, ["ouro (Llama, same layers)", weights, length, 1, f"{ms:,.0f}", f"{1000 / ms:.3f}", "", ""])
        label = f"ouro {weights} looplab 1 loop / Llama same layers, median ms per token of {REPEATS}, prompt {length}"
        print_measure(label, mine / ms)
    del llama


def _row(table: list, row: list) -> None:
    """Add ``row`` to ``table`` and print it now (a long run that dies still leaves what it measured)."""
    table.append(row)
    print("row: " + " | ".join(map(str, row)), flush=True)


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=["ouro", "huginn"], choices=sorted(FILES))
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=sorted(DTYPES))
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--prompt", type=int, nargs="+", default=[16, 512], help="prompt lengths in tokens (Ouro)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line())
    limits = {name: bandwidth(DTYPES[name]) for name in args.dtype}
    limits["int8"] = limits.get("float32") or bandwidth(torch.float32)
    print("memory bandwidth (matrix-vector product): " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in limits.items()))
    decode, loads, quality, memory = [], [], [], []
    speeds: dict[tuple, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.family:
            folder = write_random_dir(family, Path(scratch) / family)
            raw = json.loads((folder / "config.json").read_text())
            model_dir = open_model_dir(folder)
            native = model_dir.native_loops
            prompts = args.prompt if family == "ouro" else [min(args.prompt)]
            for weights in [*args.dtype, *([] if args.no_int8 else ["int8"])]:
                dtype = DTYPES["float32" if weights == "int8" else weights]
                start = time.perf_counter()
                loop = model_dir.load(dtype)
                load_s = time.perf_counter() - start
                if weights == "int8":
                    probe = torch.randint(0, raw["vocab_size"], (1, 64), generator=torch.Generator().manual_seed(1))
                    cost = int8_quality(loop, probe, native)
                    _row(quality, [family, native, f"{cost.max_logit_diff:.4g}", f"{cost.agreement:.1%}", cost.layers])
                _row(loads, [family, weights, f"{load_s:.1f}", f"{peak_gib():.1f}"])
                layers = len(loop.core)
                shape = decodable(loop).cfg  # the core's key-value heads and their width (the cache's)
                kv_heads, head_dim = shape.kv_heads, shape.head_dim
                for length in prompts:
                    prompt = list(range(1, length + 1))
                    for loops in LOOPS[family]:
                        ms, _ = ms_per_token(loop, prompt, loops, args.new_tokens)
                        bound = bytes_per_token(loop, loops, length + 1, layers, kv_heads, head_dim) / (
                            limits[weights] * GB
                        )
                        speeds[family, weights, length, loops] = ms
                        _row(decode, [family, weights, length, loops, f"{ms:,.0f}", f"{1000 / ms:.3f}",
                                       f"{bound * 1000:,.0f}", f"{bound * 1000 / ms:.2f}"])  # fmt: skip
                if weights != "int8":
                    fixed = GenerationExit("fixed", native)
                    prompt = list(range(1, prompts[0] + 1))
                    cached, _ = ms_per_token(loop, prompt, native, args.new_tokens, fixed)
                    recomputed = recompute_ms_per_token(loop, prompt, native, args.new_tokens)
                    print_measure(f"{family} {weights} per_loop cache / recompute, tokens/s at {native} loops",
                                  recomputed / cached)  # fmt: skip
                if family == "ouro" and weights != "int8":
                    early = GenerationExit("gate", native, {"threshold": 0.5})
                    prompt = list(range(1, prompts[0] + 1))
                    gated, depths = ms_per_token(loop, prompt, native, args.new_tokens, early)
                    every, _ = ms_per_token(loop, prompt, native, args.new_tokens, early, read_only_exit=True)
                    depth = sum(depths) / len(depths)
                    print_measure(f"ouro {weights} gate exit 0.5 (mean depth {depth:.2f}) / read-only, tokens/s",
                                  every / gated)  # fmt: skip
                if weights == args.dtype[0]:
                    for loops in (4, 8, 16):
                        row = [family, loops]
                        for cache in ("per_loop", "shared", "last_m"):
                            run = generate(
                                loop, [[1, 2, 3, 4]], 1, DecodeOptions(GenerationExit("fixed", loops), cache)
                            )
                            row.append(f"{run.cache_bytes / 5 * 1024 / 2**20:,.0f}")  # prompt + new-token slots
                        _row(memory, row)
                if family == "ouro" and weights != "int8":
                    compare_with_llama(loop, raw, dtype, weights, prompts, args.new_tokens, decode)
                del loop
                gc.collect()  # the next dtype's weights load into the memory these held
            for length in prompts:
                for loops in LOOPS[family]:
                    if ("float32" in args.dtype) and not args.no_int8:
                        ratio = speeds[family, "float32", length, loops] / speeds[family, "int8", length, loops]
                        print_measure(f"{family} int8 / float32 tokens/s, prompt {length}, {loops} loops", ratio)
                    if {"float32", "bfloat16"} <= set(args.dtype):
                        ratio = speeds[family, "float32", length, loops] / speeds[family, "bfloat16", length, loops]
                        print_measure(f"{family} bfloat16 / float32 tokens/s, prompt {length}, {loops} loops", ratio)
    print_table(["family", "weights", "load s", "peak RSS GiB"], loads)
    print_table(["family", "weights", "prompt", "loops", "ms/token", "tokens/s", "bound ms", "of bound"], decode)
    print_table(["family", "loops", "int8 max |Δ logit|", "greedy agreement", "int8 layers"], quality)
    print_table(["family", "loops", "per_loop MiB / 1K tok", "shared", "last_m (m 2)"], memory)


if __name__ == "__main__":
    main()
