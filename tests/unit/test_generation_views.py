"""Decoding views of pretrained attention variants (looplab/generation/cache.py ``project`` / ``output``): a
Qwen3 retrofit's per-head q/k norms, read by the cached decoder as transformers' own forward reads them."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from looplab.generation import GenerationExit, generate  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.lm.retrofit import RetrofittedLoop  # noqa: E402

PROMPTS = [[3, 5, 6, 2, 1], [3, 4], [3, 4, 4, 6, 1, 5, 2, 2]]


def test_a_qwen3_retrofit_decodes_with_its_query_and_key_norms():
    config = Qwen3Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():  # norms far from 1, so a path that skipped them would pick other tokens
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.2, 3.0)
            layer.self_attn.k_norm.weight.uniform_(0.2, 3.0)
    retrofit = RetrofittedLoop(model, 1, 2, 1, inject_init="mix").eval()
    cached = generate(retrofit, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 3), "per_loop"))
    recomputed = generate(retrofit, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 3), "none"))
    assert cached.tokens == recomputed.tokens
    flat = [lp for row in cached.logprobs for lp in row]
    assert flat == pytest.approx([lp for row in recomputed.logprobs for lp in row], abs=1e-6)
