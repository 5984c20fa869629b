"""The gradient step every training loop takes (looplab.train.gradients)."""

import math

import torch
from torch import nn

from looplab.train.gradients import apply_gradients


def _two_modules():
    torch.manual_seed(0)
    return nn.Linear(3, 3), nn.Linear(3, 1)


def test_each_group_is_clipped_on_its_own_then_stepped():
    big, small = _two_modules()
    optimizer = torch.optim.SGD([*big.parameters(), *small.parameters()], lr=0.1)
    x = torch.randn(4, 3)
    loss = 1000 * big(x).pow(2).sum() + 1e-3 * small(x).sum()
    before = [p.detach().clone() for p in small.parameters()]
    norms = apply_gradients(loss, optimizer, {"big": big.parameters(), "small": small.parameters()}, clip=1.0)
    assert norms["big"] > 1.0 > norms["small"]  # the big group's norm did not rescale the small one's gradients
    assert all(float(p.grad.norm()) <= norms["small"] + 1e-6 for p in small.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, small.parameters()))


def test_a_non_finite_gradient_changes_nothing():
    big, small = _two_modules()
    optimizer = torch.optim.SGD([*big.parameters(), *small.parameters()], lr=0.1)
    before = [p.detach().clone() for p in [*big.parameters(), *small.parameters()]]
    loss = big(torch.randn(2, 3)).sum() * math.nan + small(torch.randn(2, 3)).sum()
    norms = apply_gradients(loss, optimizer, {"big": big.parameters(), "small": small.parameters()}, clip=1.0)
    assert math.isnan(norms["big"])
    assert all(torch.equal(a, b) for a, b in zip(before, [*big.parameters(), *small.parameters()]))
    assert all(p.grad is None for p in big.parameters())


def test_without_clipping_no_norm_is_reported_and_the_step_is_taken():
    big, _ = _two_modules()
    optimizer = torch.optim.SGD(big.parameters(), lr=0.1)
    before = big.weight.detach().clone()
    assert apply_gradients(big(torch.randn(2, 3)).sum(), optimizer, {"model": big.parameters()}, clip=0) == {}
    assert not torch.equal(before, big.weight)
