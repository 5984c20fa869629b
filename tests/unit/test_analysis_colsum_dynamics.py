"""ColSum concentration and token-dynamics classification on constructed inputs."""

from __future__ import annotations

import math

import pytest
import torch

from looplab.analysis.colsum import colsum_concentration
from looplab.analysis.dynamics import FIXED, ORBIT, SLIDER, token_dynamics


def test_uniform_attention_is_zero():
    probs = torch.full((2, 3, 5, 5), 1 / 5, dtype=torch.double)
    assert torch.allclose(colsum_concentration(probs), torch.zeros(2, 3, dtype=torch.double), atol=1e-12)


def test_one_column_is_one():
    probs = torch.zeros(1, 2, 4, 4)
    probs[..., 2] = 1.0
    assert torch.allclose(colsum_concentration(probs), torch.ones(1, 2, dtype=torch.double))


def test_hand_computed_case():
    # rows: [1, 0], [1/2, 1/2] → c = [3/4, 1/4]; C = 1 + (3/4 log 3/4 + 1/4 log 1/4) / log 2
    probs = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])
    expected = 1 + (0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert colsum_concentration(probs).item() == pytest.approx(expected, abs=1e-12)


def test_masked_keys_and_single_token():
    # Sample 0: 3 valid tokens attending uniformly to the valid keys, pad row ignored → 0.
    # Sample 1: one valid token → 1 by convention.
    probs = torch.zeros(2, 1, 4, 4, dtype=torch.double)
    probs[0, :, :, :3] = 1 / 3
    probs[1, :, :, 0] = 1.0
    valid = torch.tensor([[True, True, True, False], [True, False, False, False]])
    value = colsum_concentration(probs, valid)
    assert value[0, 0].item() == pytest.approx(0.0, abs=1e-12)
    assert value[1, 0].item() == 1.0


def test_token_dynamics_kinds_and_periods():
    loops, d = 24, 4
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(d, generator=g) for _ in range(3))
    fixed = a.expand(loops, d)
    period2 = torch.stack([a if t % 2 == 0 else b for t in range(loops)])
    period3 = torch.stack([(a, b, c)[t % 3] for t in range(loops)])
    drift = torch.stack([a + 0.5 * t * b for t in range(loops)])
    x = torch.stack([fixed, period2, period3, drift], dim=1)  # [loops, 4, d]
    result = token_dynamics(x, window=12, tol=1e-6, max_period=4)
    assert result.labels.tolist() == [FIXED, ORBIT, ORBIT, SLIDER]
    assert result.periods.tolist() == [1, 2, 3, 0]
    assert result.fractions == {"fixed_point": 0.25, "orbit": 0.5, "slider": 0.25}


def test_token_dynamics_window_ignores_transient():
    x = torch.cat([torch.randn(5, 3, 2), torch.ones(6, 3, 2)])
    result = token_dynamics(x, window=6)
    assert result.fractions["fixed_point"] == 1.0


def test_a_state_growing_along_a_fixed_direction_is_at_a_fixed_point():
    """h_t = t·v (a pre-norm stream without injection): its direction, all the readout sees, is fixed."""
    from looplab.analysis.dynamics import token_dynamics

    v = torch.randn(3, 8, dtype=torch.float64)
    steps = torch.arange(1, 33, dtype=torch.float64)[:, None, None]
    growing = token_dynamics(steps * v, window=16)
    assert growing.fractions["fixed_point"] == 1.0
    drifting = token_dynamics(torch.cumsum(torch.randn(32, 3, 8, dtype=torch.float64), 0), window=16)
    assert drifting.fractions["slider"] == 1.0


def test_token_classes_agree_with_the_self_cosine():
    """A token the dynamics call fixed keeps its direction: its cosine to the final state stays near 1."""
    from looplab.analysis.dynamics import FIXED, token_dynamics

    torch.manual_seed(0)
    target, away = torch.randn(50, 16, dtype=torch.float64), torch.randn(50, 16, dtype=torch.float64)
    rates = torch.linspace(0.5, 0.99, 50, dtype=torch.float64)[:, None]  # fast to slow convergence in direction
    trajectory = torch.stack([(1 + t) * (target + rates**t * away) for t in range(64)])
    window, tol = 16, 1e-3
    found = token_dynamics(trajectory, window=window, tol=tol)
    late = trajectory[-window:]
    cos = torch.nn.functional.cosine_similarity(late, late[-1:].expand_as(late), dim=-1).min(0).values
    fixed = found.labels == FIXED
    assert fixed.any() and (~fixed).any()
    assert torch.equal(fixed, cos >= 1 - tol)  # fixed exactly when the self cosine stays within tol of 1
