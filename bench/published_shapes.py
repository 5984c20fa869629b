"""What Ouro and Huginn-0125 cost at their published shapes, with random weights (no weights can be
downloaded here): each family's published config (tests/data/reference_configs) is written as a model dir
of random bfloat16 weights, then

- load: the seconds ``open_model_dir(...).load`` takes, and the process's peak resident memory after it;
- decode tokens/s with the ``per_loop`` cache against recomputing the whole sequence per token (``--cache
  none``: what users of the remote code run with its cache off), at the native loop count, batch 1;
- Ouro: tokens/s with its ``gate`` exit at a threshold that exits early, against every loop (read-only);
- KV memory per 1K tokens at 4, 8 and 16 loops for each cache policy (the decoder's own allocation).

    python bench/published_shapes.py [--family ouro huginn] [--new-tokens 4] [--prompt 16] [--threads 2]

Minutes on a CPU (Huginn's 3.5 B parameters at 32 recurrences); ``RATIO`` lines give the speed-ups.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch
from timing import machine_line, print_measure, print_table

from looplab.generation import GenerationExit, generate
from looplab.generation.options import DecodeOptions
from looplab.lm.families import LOOPED_FAMILIES
from looplab.lm.model_dir import open_model_dir

CONFIGS = Path(__file__).parent.parent / "tests" / "data" / "reference_configs"
FILES = {"ouro": "ouro-1.4b_config.json", "huginn": "huginn-0125_raven_config_minimal.json"}


def write_random_dir(family: str, folder: Path) -> Path:
    """The published config and random bfloat16 weights under the published names, with a tiny tokenizer."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    raw = json.loads((CONFIGS / FILES[family]).read_text())
    record = LOOPED_FAMILIES[raw["model_type"]]
    config = record.config_reader(raw, FILES[family])
    with torch.device("meta"):
        model = record.model(config)
    generator = torch.Generator().manual_seed(0)
    weights = {}
    for name, parameter in model.state_dict().items():
        if name == "lm_head.weight" and family == "huginn":
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


def tokens_per_second(loop, prompt: list[int], new: int, rule: GenerationExit, cache: str, **params) -> tuple:
    start = time.perf_counter()
    run = generate(loop, [prompt], new, DecodeOptions(rule, cache, decoder_params=params))
    return new / (time.perf_counter() - start), run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=["ouro", "huginn"], choices=sorted(FILES))
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line())
    speed, memory = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.family:
            folder = write_random_dir(family, Path(scratch) / family)
            start = time.perf_counter()
            model_dir = open_model_dir(folder)
            loop = model_dir.load(torch.bfloat16)
            load_s = time.perf_counter() - start
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            native = model_dir.native_loops
            prompt = list(range(1, args.prompt + 1))
            fixed = GenerationExit("fixed", native)
            cached, _ = tokens_per_second(loop, prompt, args.new_tokens, fixed, "per_loop")
            recomputed, _ = tokens_per_second(loop, prompt, args.new_tokens, fixed, "none")
            speed.append([family, f"{load_s:.1f}", f"{rss:.1f}", native, "per_loop", f"{cached:.3f}", ""])
            speed.append([family, "", "", native, "none (recompute)", f"{recomputed:.3f}", ""])
            print_measure(f"{family} per_loop cache / recompute, tokens/s at {native} loops", cached / recomputed)
            if family == "ouro":
                early = GenerationExit("gate", native, {"threshold": 0.5})
                gated, run = tokens_per_second(loop, prompt, args.new_tokens, early, "per_loop")
                every, _ = tokens_per_second(loop, prompt, args.new_tokens, early, "per_loop", read_only_exit=True)
                depth = sum(run.depths[0]) / len(run.depths[0])
                speed.append([family, "", "", native, f"gate 0.5 (mean depth {depth:.2f})", f"{gated:.3f}", ""])
                speed.append([family, "", "", native, "gate 0.5 read-only (every loop)", f"{every:.3f}", ""])
                print_measure("ouro gate exit 0.5 that skips loops / read-only, tokens/s", gated / every)
            for loops in (4, 8, 16):
                row = [family, loops]
                for cache in ("per_loop", "shared", "last_m"):
                    run = generate(loop, [prompt[:4]], 1, DecodeOptions(GenerationExit("fixed", loops), cache))
                    slots = 4 + 1  # the decoder allocates prompt + new-token slots
                    row.append(f"{run.cache_bytes / slots * 1024 / 2**20:,.0f}")
                memory.append(row)
            del loop
    print_table(["family", "load s", "peak RSS GiB", "loops", "decoding", "tokens/s", ""], speed)
    print_table(["family", "loops", "per_loop MiB / 1K tok", "shared", "last_m (m 2)"], memory)


if __name__ == "__main__":
    main()
