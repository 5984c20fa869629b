"""The linearised loop: J v equal to forward-mode AD's, and JSRR gradients equal to finite differences."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.func import jvp

from looplab.config import ModelConfig
from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopProbe
from looplab.stability.jacobian import jsrr_per_sample, loop_map, random_direction
from looplab.tasks import make_task

TASK = make_task("copy")
D = 8


def _setup(seed: int = 0, **model):
    """A double-precision model (2 core layers), a padded batch, and a state h that is not e."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=D, n_heads=2, core_layers=2, init_std=0.4, init_scaling="sqrt_d", **model)
    net = LoopedTransformer(cfg, TASK.vocab_size).double()
    with torch.no_grad():  # affine norms away from (1, 0), so that their parameters matter
        for name, param in net.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
    batch = TASK.sample_lengths(torch.tensor([3, 1, 2]), torch.Generator().manual_seed(seed))
    h, e, _ = net.start(batch.tokens, batch.valid)
    h = (h + 0.5 * torch.randn_like(h)).detach()
    return net, batch, h, e.detach()


ARCHITECTURES = [
    dict(placement=placement, norm=norm, injection=injection, positional=positional, causal=causal)
    for placement, norm, injection, positional, causal in itertools.product(
        ("pre", "post", "pre_sandwich", "post_sandwich"),
        ("layernorm", "rmsnorm", "simplenorm"),
        ("add", "concat", "none"),
        ("rope", "learned"),
        (False, True),
    )
] + [
    dict(attention_window=1, causal=True, core_out_norm=True),
    dict(injection="concat", inject_init="random", core_out_norm=True, norm="rmsnorm"),
    dict(injection="contractive", placement="pre", positional="rope"),
    dict(injection="contractive", placement="post_sandwich", norm="rmsnorm", causal=True),
]


@pytest.mark.parametrize("model", ARCHITECTURES, ids=lambda m: "-".join(str(v) for v in m.values()))
def test_tangent_equals_forward_mode_ad(model):
    net, batch, h, e = _setup(**model)
    phi = loop_map(net, e, batch.valid)
    v = random_direction(batch.valid, D, torch.Generator().manual_seed(1), dtype=torch.float64)
    expected_h, expected_jv = jvp(phi, (h,), (v,))
    out_h, apply = phi.linearise(h)
    assert torch.allclose(out_h, expected_h, atol=1e-12)
    assert torch.allclose(apply(v), expected_jv, atol=1e-12)
    w = random_direction(batch.valid, D, torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.allclose(apply(w), jvp(phi, (h,), (w,))[1], atol=1e-12)  # the primal serves every v


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "simplenorm"])
@pytest.mark.parametrize("estimator", ["jvp", "vjp", "frobenius"])
def test_penalty_gradient_equals_finite_differences(norm, estimator):
    """⟨∇θ penalty, u⟩ by autograd against (P(θ + εu) − P(θ − εu)) / 2ε along random parameter directions u.

    (Reverse mode through ``torch.func.jvp`` of ``layer_norm`` drops the input-dependence of the
    norm's saved statistics, so it gave wrong JSRR gradients for LayerNorm models: this catches that.)
    """
    net, batch, h, e = _setup(norm=norm, placement="post_sandwich", positional="rope")
    direction = random_direction(batch.valid, D, torch.Generator().manual_seed(2), dtype=torch.float64)
    probe = LoopProbe(h, e, batch.valid)
    params = list(net.parameters())

    def penalty() -> torch.Tensor:
        return jsrr_per_sample(net, probe, estimator, direction=direction).sum()  # v fixed: no power iterations

    gradients = torch.autograd.grad(penalty(), params, allow_unused=True)
    generator = torch.Generator().manual_seed(3)
    eps = 1e-5
    for _ in range(3):
        u = [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]
        along = sum(float((g * du).sum()) for g, du in zip(gradients, u) if g is not None)
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                for p, du in zip(params, u):
                    p.add_(sign * eps * du)
            values.append(float(penalty().detach()))
            with torch.no_grad():
                for p, du in zip(params, u):
                    p.sub_(sign * eps * du)
        assert along == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-5)
