"""A small randomised looped model and padded batches, shared by the model and attention tests."""

from __future__ import annotations

import torch

from looplab.config import ModelConfig
from looplab.model import LoopedTransformer

VOCAB = 7
TOL = 1e-5


def randomise(model: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Give every parameter (norm scales, biases, the head bias too) a generic non-trivial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if p.dim() >= 2:
                p.copy_(scale * noise)
            elif name.endswith("weight"):  # a norm's scale
                p.copy_(1.0 + 0.1 * noise)
            else:  # a bias
                p.copy_(0.1 * noise)


def make_model(seed: int = 0, dtype=torch.float64, randomize: bool = True, **overrides) -> LoopedTransformer:
    base = dict(d_model=16, n_heads=2, mlp_ratio=2, core_layers=1, max_len=32)
    cfg = ModelConfig(**{**base, **overrides})
    torch.manual_seed(seed)
    model = LoopedTransformer(cfg, VOCAB).to(dtype)
    if randomize:
        randomise(model, seed)
    return model


def make_batch(lengths=(6, 3, 5, 1, 4), width: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    tokens = torch.randint(1, VOCAB, (len(lengths), width), generator=g)
    valid = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    return tokens, valid


def gen(seed: int = 123) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_close_on(a, b, mask, atol=TOL):
    """Compare [..., L, V] tensors on positions where mask [..., L] is True."""
    diff = (a - b).abs().amax(-1)[mask]
    assert diff.numel() > 0
    worst = float(diff.detach().max())
    assert worst <= atol, worst


def tiny_llama_retrofit():
    """A (1, 2⊗r, 1) retrofit with W_I = [I/2 | I/2] of a random 5-layer Llama in float64 with grouped keys
    and values (4 heads, 2 key/value heads; eager attention), in eval mode. Needs transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from looplab.lm.retrofit import RetrofittedLoop

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        max_position_embeddings=128,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    source = LlamaForCausalLM(config).to(torch.float64).eval()
    return RetrofittedLoop(source, 1, 2, 1, inject_init="mix").eval()
