"""Initialisation options: Linear and embedding std, and the concat injection's W_I."""

from __future__ import annotations

import math

import pytest
import torch

from looplab.config import load_config
from looplab.errors import LooplabError
from looplab.model import LoopedTransformer
from looplab.model.looped import injection_weight

WIDE = ["model.d_model=256", "model.n_heads=4", "model.core_layers=2"]


def build(*overrides: str, seed: int = 0) -> LoopedTransformer:
    config = load_config(None, [*WIDE, *overrides])
    torch.manual_seed(seed)
    return LoopedTransformer(config.model, vocab_size=11)


def linear_weights(model: LoopedTransformer) -> torch.Tensor:
    return torch.cat(
        [m.weight.flatten() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.inject]
    )


@pytest.mark.parametrize(
    "overrides, std",
    [
        ((), 0.02),
        (("model.init_std=0.05",), 0.05),
        (("model.init_std=0.4", 'model.init_scaling="sqrt_d"'), 0.4 / math.sqrt(256)),
        (("model.init_std=1.6", 'model.init_scaling="sqrt_d"'), 0.1),
    ],
)
def test_linear_weight_std(overrides, std):
    weights = linear_weights(build(*overrides))
    assert weights.mean().abs() < 0.05 * std
    assert abs(weights.std().item() / std - 1) < 0.01
    biases = [m.bias for m in build(*overrides).modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert all(torch.count_nonzero(b) == 0 for b in biases)


@pytest.mark.parametrize("std", [0.02, 1.0])
def test_embedding_std_covers_tokens_and_learned_positions(std):
    model = build(f"model.embed_std={std}", 'model.positional="learned"', "model.max_len=256")
    for weight in (model.embedding.weight, model.positions.weight):
        assert abs(weight.std().item() / std - 1) < 0.05


def test_injection_blocks():
    d = 8
    eye, zero = torch.eye(d), torch.zeros(d, d)
    assert torch.equal(injection_weight("sum", d), torch.cat([eye, eye], 1))
    assert torch.equal(injection_weight("state", d), torch.cat([zero, eye], 1))
    assert torch.equal(injection_weight("input", d), torch.cat([eye, zero], 1))
    assert torch.equal(injection_weight("mix", d), torch.cat([eye / 2, eye / 2], 1))
    with pytest.raises(LooplabError, match="valid choices: input, mix, random, state, sum"):
        injection_weight("eye", d)


@pytest.mark.parametrize("gain", [0.25, 1.0])
def test_random_injection_has_gain_over_sqrt_d(gain):
    weight = build('model.injection="concat"', 'model.inject_init="random"', f"model.inject_gain={gain}").inject.weight
    assert weight.shape == (256, 512)
    assert abs(weight.std().item() / (gain / 16) - 1) < 0.01


def test_random_injection_follows_the_seed():
    first = build('model.injection="concat"', 'model.inject_init="random"', seed=1).inject.weight
    again = build('model.injection="concat"', 'model.inject_init="random"', seed=1).inject.weight
    other = build('model.injection="concat"', 'model.inject_init="random"', seed=2).inject.weight
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_sum_injection_equals_add_exactly():
    concat = build('model.injection="concat"', "model.init_std=0.05", "model.embed_std=1.0")
    added = build('model.injection="add"')
    added.load_state_dict({k: v for k, v in concat.state_dict().items() if not k.startswith("inject.")})
    tokens = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        for (h_concat, _), (h_add, _) in zip(concat.unroll(tokens, valid, 6), added.unroll(tokens, valid, 6)):
            assert torch.equal(h_concat, h_add)


def test_state_injection_ignores_the_input_after_the_first_loop():
    model = build('model.injection="concat"', 'model.inject_init="state"')
    h, e = torch.randn(2, 5, 256), torch.randn(2, 5, 256)
    assert torch.equal(model.core_input(h, e), h)
