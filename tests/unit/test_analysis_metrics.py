"""Fixed points, convergence, attention differences, the Lipschitz bound and massive activations."""

from __future__ import annotations

import math

import pytest
import torch

from looplab.analysis.attention import attention_difference, lipschitz_check
from looplab.analysis.fixed_points import (
    convergence,
    fixed_point_cross_cos_min,
    fixed_point_self_cos,
    layer_cosines,
    self_convergence,
)
from looplab.analysis.massive import colsum_mlp_ablation, massive_activations, massive_ratio, zero_mlp
from looplab.config import ModelConfig
from looplab.model import LoopedTransformer
from looplab.model.trace import trace


def tiny_model(**overrides) -> LoopedTransformer:
    base = dict(d_model=16, n_heads=2, mlp_ratio=2, core_layers=2, max_len=16)
    torch.manual_seed(0)
    model = LoopedTransformer(ModelConfig(**{**base, **overrides}), 5).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def inputs():
    g = torch.Generator().manual_seed(2)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[0, 3:] = False
    return torch.randint(0, 5, (2, 5), generator=g), valid


def test_layer_cosines_and_summaries_on_constructed_states():
    # 3 layers, B = 1, T = 1, d = 2 at the last loop: e1, e2, (e1 + e2)/√2 scaled.
    final = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]).view(3, 1, 1, 2)
    states = torch.stack([final, final])  # [loops=2, layers=3, 1, 1, 2]
    matrix = layer_cosines(states)
    s = 1 / math.sqrt(2)
    assert torch.allclose(matrix, torch.tensor([[1, 0, s], [0, 1, s], [s, s, 1]]), atol=1e-6)
    assert fixed_point_cross_cos_min(states) == pytest.approx(0.0, abs=1e-7)
    assert fixed_point_cross_cos_min(states[:, :1]) != fixed_point_cross_cos_min(states[:, :1])  # NaN


def test_self_convergence_and_self_cos():
    # layer 0 rotates towards its final direction: angles 90°, 45°, 0° → cos 0, 1/√2, 1
    path = torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]).view(3, 1, 1, 1, 2)
    curve = self_convergence(path)
    assert torch.allclose(curve, torch.tensor([[0.0, 1 / math.sqrt(2), 1.0]]), atol=1e-6)
    assert fixed_point_self_cos(path, window=1) == pytest.approx(1 / math.sqrt(2))
    assert fixed_point_self_cos(path, window=2) == pytest.approx(0.0, abs=1e-7)


def test_convergence_on_constructed_trajectory():
    # X_t = (1 + 2^-t) v: Δ_t = 2^-t / (1 + 2^-t) for t = 2, 3
    v = torch.tensor([3.0, 4.0])
    states = torch.stack([(1 + 2.0**-t) * v for t in (1, 2, 3)]).view(3, 1, 1, 1, 2)
    expected = torch.tensor([[2.0**-2 / (1 + 2.0**-2), 2.0**-3 / (1 + 2.0**-3)]])
    assert torch.allclose(convergence(states), expected, atol=1e-6)
    # padded tokens never count
    padded = torch.cat([states, 100 * torch.randn(3, 1, 1, 1, 2)], dim=3)
    valid = torch.tensor([[True, False]])
    assert torch.allclose(convergence(padded, valid), expected, atol=1e-6)
    assert convergence(padded, valid, per_sample=True).shape == (1, 2, 1)


def test_attention_difference():
    attn = torch.rand(3, 2, 2, 1, 4, 4)
    attn[2] = attn[1]
    diff = attention_difference(attn)
    assert diff.shape == (2, 3, 3)
    assert torch.all(diff[:, 1, 2] == 0) and torch.all(diff.diagonal(dim1=1, dim2=2) == 0)
    assert torch.allclose(diff[:, 0, 1], (attn[0] - attn[1]).flatten(2).norm(dim=-1).mean(-1), atol=1e-6)


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_lipschitz_bound_holds(positional):
    model = tiny_model(positional=positional)
    recorded = trace(model, *inputs(), 5, attention=True, dtype=torch.float64)
    check = lipschitz_check(model, recorded, atol=0.0)
    assert check.ratio.shape == (2, 4, 2, 2)
    assert bool(check.holds.all())
    assert float(check.ratio.max()) > 0


def test_massive_ratio():
    x = torch.ones(1, 2, 3)  # [B, T, d], median 1
    x[0, 1, 2] = -50.0
    assert massive_ratio(x).item() == pytest.approx(50.0)
    x[0, 0, 0] = 1000.0  # on a padded token: ignored
    valid = torch.tensor([[False, True]])
    assert massive_ratio(x, valid).item() == pytest.approx(50.0)
    states = torch.ones(2, 3, 1, 2, 3)
    assert massive_activations(states).shape == (2, 3)


def test_mlp_ablation_changes_output_and_removes_hook():
    model = tiny_model(positional="learned")
    tokens, valid = inputs()
    with torch.no_grad():
        before = model(tokens, valid, 3)
        with zero_mlp(model, 0):
            ablated = model(tokens, valid, 3)
        after = model(tokens, valid, 3)
    assert not torch.allclose(before, ablated)
    assert torch.equal(before, after)
    assert not model.core[0].mlp._forward_hooks
    base, zeroed = colsum_mlp_ablation(model, tokens, valid, 3, layer=1)
    assert base.shape == zeroed.shape == (3, 2, 2)
    assert not torch.allclose(base, zeroed)
    assert not model.core[1].mlp._forward_hooks
