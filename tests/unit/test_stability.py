"""The loop Jacobian (JVP/VJP/Frobenius, spectral radius), random loop schedules, truncated backprop."""

from __future__ import annotations

import math

import pytest
import torch

from looplab.config import ModelConfig, ScheduleConfig
from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopProbe
from looplab.schedules import ScheduleContext, make_schedule
from looplab.stability.jacobian import (
    jacobian_vector,
    jsrr_per_sample,
    loop_map,
    random_direction,
    spectral_radius_exact,
    spectral_radius_power,
    vector_jacobian,
)
from looplab.tasks import make_task

TASK = make_task("copy")


def _setup(seed=0, placement="post_sandwich", d=8, loops=3, padded=True):
    """A tiny double-precision model on the SDPA kernel, a padded batch, its state after ``loops`` loops and Φ."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=d, n_heads=2, core_layers=1, placement=placement, injection="add", attention="sdpa")
    model = LoopedTransformer(cfg, TASK.vocab_size).double()
    batch = TASK.sample_lengths(torch.tensor([2, 1] if padded else [2, 2]), torch.Generator().manual_seed(seed))
    h, e, ctx = model.start(batch.tokens, batch.valid)
    for _ in range(loops):
        h = model.step(h, e, ctx)
    return model, batch, h.detach(), e.detach(), loop_map(model, e.detach(), batch.valid)


def _full_jacobian(phi, h):
    """[B, L·d, B, L·d] → per-sample blocks [B, L·d, L·d]."""
    jac = torch.autograd.functional.jacobian(phi, h)
    b, n = h.shape[0], h[0].numel()
    jac = jac.reshape(b, n, b, n)
    return torch.stack([jac[i, :, i] for i in range(b)])


def test_jvp_equals_explicit_jacobian_times_v():
    model, batch, h, e, phi = _setup()
    v = random_direction(batch.valid, 8, torch.Generator().manual_seed(1), dtype=torch.float64)
    explicit = torch.einsum("bij,bj->bi", _full_jacobian(phi, h), v.flatten(1)).view_as(h)
    assert torch.allclose(jacobian_vector(phi, h, v), explicit, atol=1e-10)
    vjp = vector_jacobian(phi, h, v, create_graph=False)
    explicit_t = torch.einsum("bji,bj->bi", _full_jacobian(phi, h), v.flatten(1)).view_as(h)
    assert torch.allclose(vjp, explicit_t, atol=1e-10)


def test_random_direction_is_unit_and_zero_on_padding():
    valid = torch.tensor([[True, True, False], [True, False, False]])
    v = random_direction(valid, 4, torch.Generator().manual_seed(0))
    assert torch.allclose(v.flatten(1).norm(dim=1), torch.ones(2))
    assert (v[~valid] == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_power_iteration_finds_the_spectral_radius(seed):
    model, batch, h, e, phi = _setup(seed=seed, padded=False)
    growth, _ = spectral_radius_power(phi, h, batch.valid, iters=400, generator=torch.Generator().manual_seed(0))
    for i in range(len(h)):
        exact = spectral_radius_exact(loop_map(model, e[i : i + 1], batch.valid[i : i + 1]), h[i : i + 1])
        eigenvalues = torch.linalg.eigvals(_full_jacobian(phi, h)[i]).abs()
        assert exact == pytest.approx(float(eigenvalues.max()), rel=1e-9)
        assert float(growth[i]) == pytest.approx(exact, rel=0.03)


def test_frobenius_estimator_is_unbiased():
    model, batch, h, e, phi = _setup(padded=False)
    jac = _full_jacobian(phi, h)
    target = float((jac.pow(2).sum((1, 2)) / jac.shape[1]).mean())
    probe = LoopProbe(h, e, batch.valid)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        estimates = [float(jsrr_per_sample(model, probe, "frobenius", 0, generator).mean()) for _ in range(400)]
    assert sum(estimates) / len(estimates) == pytest.approx(target, rel=0.1)


@pytest.mark.parametrize("estimator", ["jvp", "vjp", "frobenius"])
def test_jsrr_is_differentiable_through_the_sdpa_model(estimator):
    model, batch, h, e, phi = _setup()
    assert model.cfg.attention == "sdpa"  # the penalty switches to the math path itself
    h = h.clone().requires_grad_(True)
    penalty = jsrr_per_sample(
        model, LoopProbe(h, e, batch.valid), estimator, 1, torch.Generator().manual_seed(0)
    ).mean()
    penalty.backward()
    assert penalty.item() > 0
    matrices = [p for p in model.core.parameters() if p.dim() == 2]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in matrices)


def test_jvp_penalty_after_power_iterations_approaches_rho_squared():
    model, batch, h, e, phi = _setup(padded=False)
    probe = LoopProbe(h, e, batch.valid)
    with torch.no_grad():
        penalty = jsrr_per_sample(model, probe, "jvp", 300, torch.Generator().manual_seed(0)).mean()
    exact = [
        spectral_radius_exact(loop_map(model, e[i : i + 1], batch.valid[i : i + 1]), h[i : i + 1]) for i in range(2)
    ]
    assert penalty.item() == pytest.approx(sum(r * r for r in exact) / 2, rel=0.1)


def _schedule(**kwargs):
    return make_schedule(ScheduleConfig(**kwargs), ScheduleContext(TASK, 8))


def test_poisson_lognormal_mean_is_the_requested_mean():
    schedule = _schedule(name="poisson_lognormal", mean_depth=6.0, sigma=0.7, hi=10_000, per_batch=False)
    depths = schedule.train_depths(torch.ones(100_000, dtype=torch.long), torch.Generator().manual_seed(0))
    assert depths.min() >= 1
    assert depths.double().mean().item() == pytest.approx(6.0, rel=0.02)


def test_lognormal_range_median_and_per_batch():
    schedule = _schedule(name="lognormal", mu=2.0, sigma=0.7, lo=1, hi=100, per_batch=False)
    depths = schedule.train_depths(torch.ones(50_000, dtype=torch.long), torch.Generator().manual_seed(0))
    assert depths.min() >= 1 and depths.max() <= 100
    assert depths.double().median().item() == pytest.approx(math.exp(2.0), abs=1)
    assert depths.unique().numel() > 20
    per_batch = _schedule(name="lognormal", per_batch=True, depth=7)
    batch_depths = per_batch.train_depths(torch.ones(64, dtype=torch.long), torch.Generator().manual_seed(3))
    assert batch_depths.unique().numel() == 1
    assert per_batch.policy_depth(torch.ones(3, dtype=torch.long)).tolist() == [7, 7, 7]


@pytest.mark.parametrize("keep", [1, 3, 10])
def test_truncated_backprop_equals_detaching_k_loops_before_the_end(keep):
    model, batch, *_ = _setup(padded=False)
    depths = torch.tensor([5, 5])
    model.zero_grad()
    model.forward_at_depths(batch.tokens, batch.valid, depths, backprop_loops=keep).pow(2).sum().backward()
    truncated = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    h, e, ctx = model.start(batch.tokens, batch.valid)
    for t in range(1, 6):
        if t == 5 - keep + 1:
            h = h.detach()
        h = model.step(h, e, ctx)
    model.readout(h, ctx).pow(2).sum().backward()
    manual = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    for a, b in zip(truncated, manual):
        assert torch.allclose(a, b, atol=1e-10)
    if keep < 5:
        model.zero_grad()
        model.forward_at_depths(batch.tokens, batch.valid, depths).pow(2).sum().backward()
        full = [p.grad for p in model.parameters()]
        assert not all(torch.allclose(a, b) for a, b in zip(truncated, full))


def test_jsrr_on_a_row_subset_is_the_full_penalty_of_those_rows_and_unbiased():
    from looplab.regularisers import JacobianPenalty

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=8, n_heads=2, core_layers=1, placement="post_sandwich", injection="add")
    model = LoopedTransformer(cfg, TASK.vocab_size).double()
    batch = TASK.sample_lengths(torch.tensor([3, 1, 2, 3, 2, 1]), torch.Generator().manual_seed(0))
    h, e, ctx = model.start(batch.tokens, batch.valid)
    probe = LoopProbe(model.step(h, e, ctx).detach(), e.detach(), batch.valid)
    full = JacobianPenalty(weight=0.1, estimator="frobenius", power_iters=0)
    subset = JacobianPenalty(weight=0.1, estimator="frobenius", power_iters=0, rows=2)
    chosen = torch.randperm(6, generator=torch.Generator().manual_seed(5))[:2]
    directions = torch.Generator().manual_seed(5)
    torch.randperm(6, generator=directions)  # the subset's draw comes first, then its directions
    expected = jsrr_per_sample(
        model, LoopProbe(probe.h[chosen], probe.e[chosen], probe.valid[chosen]), "frobenius", 0, directions
    )
    found = subset.penalty(model, probe, torch.Generator().manual_seed(5))
    assert found.shape == (2,) and torch.allclose(found, expected)
    # over many steps the subset's mean penalty estimates the whole batch's
    many = lambda reg: torch.stack(
        [reg.penalty(model, probe, torch.Generator().manual_seed(s)).mean().detach() for s in range(400)]
    ).mean()
    assert float(many(subset)) == pytest.approx(float(many(full)), rel=0.1)
    assert (
        JacobianPenalty(weight=0.1, rows=6).params.rows == 6
        and len(JacobianPenalty(weight=0.1, estimator="jvp", rows=9).penalty(model, probe, None)) == 6
    )


def test_warm_started_power_iteration_tracks_the_exact_radius_along_a_trajectory():
    from looplab.stability.spectral import warm_spectral_radii

    model, batch, *_ = _setup(seed=0, placement="pre", padded=False, loops=0)  # ρ falls from 1.17 to 1.04
    warm = warm_spectral_radii(model, batch.tokens, batch.valid, 12, 4, torch.Generator().manual_seed(0))  # [12, B]
    exact = []
    with torch.no_grad():
        h, e, ctx = model.start(batch.tokens, batch.valid)
        for _ in range(12):
            h = model.step(h, e, ctx)
            exact.append(
                [
                    spectral_radius_exact(loop_map(model, e[i : i + 1], batch.valid[i : i + 1]), h[i : i + 1])
                    for i in range(len(h))
                ]
            )
    exact = torch.tensor(exact, dtype=torch.float64)
    # after its 16 iterations at loop 1, 4 per loop keep within a few percent of the exact radius
    assert torch.allclose(warm[4:].double(), exact[4:], rtol=0.05)
    assert (exact[0] - exact[-1] > 0.01).all()  # the radius does change along the way


def test_state_l2_is_the_mean_squared_state_over_valid_positions_and_shrinks_the_state():
    """The penalty per row is mean ‖h‖²/d over its valid positions (padding ignored), and gradient steps on
    it alone pull the state's norm down."""
    from looplab.regularisers import StateL2

    generator = torch.Generator().manual_seed(0)
    h = torch.randn(2, 4, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[True, True, True, False], [True, False, False, False]])
    penalty = StateL2(weight=0.1).penalty(None, LoopProbe(h, torch.zeros_like(h), valid), generator)
    expected = [float(h[0, :3].detach().pow(2).mean()), float(h[1, :1].detach().pow(2).mean())]
    assert penalty.detach().tolist() == pytest.approx(expected)
    penalty.sum().backward()
    assert float(h.grad[0, 3].abs().max()) == 0.0  # padding gets no gradient
    with torch.no_grad():
        smaller = h - 0.5 * h.grad
    assert float(smaller[valid].norm()) < float(h.detach()[valid].norm())
