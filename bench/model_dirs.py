"""What looplab's adapter costs over transformers' own forward, for each family a model dir can hold.

A model dir's model runs through an adapter on the looped-model protocol (``start``, ``step`` × K,
``readout``) that calls transformers' own layers: :mod:`looplab.lm.hrm_text`,
:mod:`looplab.lm.inkling2_loop`, and :class:`looplab.lm.retrofit.RetrofittedLoop` at (0, L⊗1, 0),
which is the source model itself. This times the adapter's forward at the model's native loop count
against transformers' ``model(input_ids, attention_mask)`` on the same module (one copy of the weights,
the same eager attention), interleaved in one process, for a tiny random config of each family (the
tests' sizes) and one of about 100M parameters.

Goal: the adapter ≤ 1.1× transformers' forward for every family and size.

    python bench/model_dirs.py [--repeats 9] [--only hrm_text llama]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from timing import add_common_options, machine_line, median, print_table, print_verdict, setup, time_interleaved

GOAL = 1.1
FAMILIES = ("hrm_text", "inkling2_loop", "llama")
#: (batch, tokens) of the timed forward, per size
SHAPES = {"tiny": (3, 9), "100M": (2, 128)}


def configs(family: str, size: str):
    """transformers' config of ``family`` at ``size`` (``tiny``: the tests' model; ``100M``: about 100M
    parameters, a 32k vocabulary)."""
    import transformers

    if size == "tiny":  # the tests' own configs, so the ratio is measured where exactness is tested
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.lm_dirs import LLAMA
        from tests.unit.test_native_looped import HRM, INKLING

        table = {"hrm_text": HRM, "inkling2_loop": INKLING, "llama": LLAMA}
    else:
        layer_types = ["hybrid" if (i + 1) % 3 == 0 else "hybrid_sliding" for i in range(8)]
        table = {
            "hrm_text": dict(
                vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                num_attention_heads=12, head_dim=64, H_cycles=2, L_cycles=2, max_position_embeddings=512,
            ),
            "inkling2_loop": dict(
                vocab_size=32000, unpadded_vocab_size=32000, hidden_size=640, num_hidden_layers=8,
                num_attention_heads=10, num_key_value_heads=5, head_dim=64, swa_num_attention_heads=10,
                swa_num_key_value_heads=5, swa_head_dim=64, sliding_window_size=64, d_rel=16, rel_extent=64,
                log_scaling_n_floor=64, n_layers_per_attn_res_block=2, moe_intermediate_size=512,
                n_routed_experts=8, num_experts_per_tok=2, loop_layer_index_start=2, loop_layer_index_end=6,
                loop_num_passes=3, loop_gate_rank=32, max_position_embeddings=512, eos_token_id=None,
                layer_types=layer_types,
            ),
            "llama": dict(
                vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512,
            ),
        }  # fmt: skip
    classes = {
        "hrm_text": (transformers.HrmTextConfig, transformers.HrmTextForCausalLM),
        "inkling2_loop": (transformers.Inkling2LoopTextConfig, transformers.Inkling2LoopForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }
    config_class, model_class = classes[family]
    return model_class(config_class(**table[family]))


def adapter(family: str, model: torch.nn.Module) -> torch.nn.Module:
    """looplab's looped model on ``model``'s own modules (no copy)."""
    if family == "llama":
        from looplab.lm.retrofit import RetrofittedLoop

        model.set_attn_implementation("eager")  # as a model dir loads it: the retrofit's layers run eager
        layers = model.config.num_hidden_layers
        return RetrofittedLoop(model, 0, layers, 0, copy_weights=False, inject_init="mix").eval()
    from looplab.lm.families import native_loop

    return native_loop(model).eval()


def measure(family: str, size: str, repeats: int, warmup: int) -> tuple[list[str], float]:
    """One family at one size: its table row and the ratio of the adapter's time to transformers'."""
    model = configs(family, size).eval()
    looped = adapter(family, model)  # switches the shared model to eager attention too
    batch, tokens = SHAPES[size]
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
    mask = torch.ones_like(ids)
    mask[-1, tokens // 2 :] = 0  # a padded row, as the exactness tests run
    with torch.no_grad():
        gap = (looped(ids, mask) - model(input_ids=ids, attention_mask=mask, use_cache=False).logits).abs()
        paths = {
            "transformers": lambda: model(input_ids=ids, attention_mask=mask, use_cache=False),
            "looplab": lambda: looped(ids, mask),
        }
        seconds = time_interleaved(paths, repeats if size != "tiny" else 5 * repeats, warmup)
    ours, theirs = median(seconds["looplab"]), median(seconds["transformers"])
    parameters = sum(p.numel() for p in model.parameters())
    valid = mask.bool()[..., None].expand_as(gap)  # padded positions are no one's prediction
    row = [
        family, size, f"{parameters / 1e6:.1f} M", f"{batch}x{tokens}", f"{1e3 * theirs:.2f}", f"{1e3 * ours:.2f}",
        f"{ours / theirs:.3f}", f"{gap[valid].max().item():.1e}",
    ]  # fmt: skip
    return row, ours / theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, repeats=9, warmup=2)
    parser.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    setup(args.threads, args.seed)
    print(machine_line(), flush=True)
    rows, worst = [], 0.0
    for family in args.only:
        for size in args.sizes:
            row, ratio = measure(family, size, args.repeats, args.warmup)
            rows.append(row)
            worst = max(worst, ratio)
            print(f"{family} {size}: {ratio:.3f}x", flush=True)
    print_table(
        ["family", "size", "parameters", "batch", "transformers ms", "looplab ms", "ratio", "max |Δ logit|"], rows
    )
    print_verdict("model-dir adapter forward / transformers forward (worst)", worst, GOAL, at_most=True)


if __name__ == "__main__":
    main()
