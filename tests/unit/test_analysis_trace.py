"""The trace of a looped model: names, selection, and equality with the model's own unroll."""

from __future__ import annotations

import pytest
import torch

from looplab.config import ModelConfig
from looplab.model import LoopedTransformer
from looplab.model.trace import trace

VOCAB = 7


def make_model(**overrides) -> LoopedTransformer:
    base = dict(d_model=16, n_heads=2, mlp_ratio=2, prelude_layers=1, core_layers=2, coda_layers=1, max_len=32)
    torch.manual_seed(0)
    model = LoopedTransformer(ModelConfig(**{**base, **overrides}), VOCAB).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 6), generator=g)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    return tokens, valid


def test_names_are_unique_and_complete():
    model = make_model()
    recorded = trace(model, *batch(), 3, attention=True, dtype=torch.float64)
    names = recorded.names()
    assert len(names) == len(set(names))
    assert {
        "prelude0.resid",
        "prelude0.attn",
        "coda0.resid",
        "loop00.state",
        "loop03.state",
        "loop01.core0.resid",
        "loop03.core1.attn",
        "loop02.core1.attn_in",
    } <= set(names)
    assert recorded.states().shape == (3, 2, 2, 6, 16)
    assert recorded.attention().shape == (3, 2, 2, 2, 6, 6)


def test_selection_keeps_only_selected_entries():
    model = make_model()
    recorded = trace(model, *batch(), 4, layers=[1], loop_indices=[2, 4], dtype=torch.float32)
    core = {n for n in recorded.names() if ".core" in n}
    assert core == {"loop02.core1.resid", "loop04.core1.resid"}
    assert recorded.states().shape == (2, 1, 2, 6, 16)
    assert recorded.states().dtype == torch.float32
    with pytest.raises(ValueError):
        recorded.attention()
    with pytest.raises(ValueError):
        trace(model, *batch(), 2, layers=[5])


@pytest.mark.parametrize("injection", ["add", "concat", "none"])
def test_states_equal_hand_recomputation_and_unroll(injection):
    model = make_model(injection=injection, core_out_norm=True)
    tokens, valid = batch()
    recorded = trace(model, tokens, valid, 3, dtype=torch.float64)
    with torch.no_grad():
        h, e, ctx = model.start(tokens, valid)
        by_hand = []
        for _ in range(3):
            x = h + e if injection == "add" else model.inject(torch.cat([e, h], -1)) if injection == "concat" else h
            layer_states = []
            for layer in model.core:
                x = layer(x, ctx)
                layer_states.append(x)
            by_hand.append(torch.stack(layer_states))
            h = model.step(h, e, ctx)
            assert torch.equal(recorded[recorded.name(len(by_hand))], h)
        unrolled = torch.stack([s for s, _ in model.unroll(tokens, valid, 3)])
    assert torch.equal(recorded.states(), torch.stack(by_hand))
    assert torch.equal(recorded.loop_states(), unrolled)
    with_attention = trace(model, tokens, valid, 3, attention=True, dtype=torch.float64)
    assert torch.allclose(with_attention.loop_states(), unrolled, atol=1e-10)
    assert torch.allclose(with_attention["coda0.resid"], recorded["coda0.resid"], atol=1e-10)


def test_attention_rows_sum_to_one():
    model = make_model(causal=True)
    tokens, valid = batch()
    attn = trace(model, tokens, valid, 2, attention=True).attention()
    assert torch.allclose(attn.sum(-1), torch.ones(attn.shape[:-1]), atol=1e-5)
    assert torch.all(attn[..., 1, :, :, 4:] == 0)  # padded keys of sample 1 get nothing
    assert torch.all(attn[..., 0, :, 0, 1:] == 0)  # causal: the first query sees only itself
