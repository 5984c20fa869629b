"""The Jacobian of one loop: the JSRR regulariser and spectral-radius measurement (docs/methods.md §6).

Φ(h) = one loop of the core with the injected input e held fixed; J = ∂Φ/∂h at
a state h (per sample, over its valid positions). Three penalties, named for
what they compute:

    jvp        ‖J v‖²,   v a random unit vector (after optional power iterations);
               by the linearised loop (``looplab.model.tangent``), on the math attention path
    vjp        ‖Jᵀ v‖²,  the same with the transpose (what the STARS code computes)
    frobenius  ‖J g‖² / D with g ~ N(0, I): Hutchinson's estimate of ‖J‖²_F / D (DEQ)

A penalty ‖Jv‖² bounds nothing by itself for a non-normal J, but after power
iterations v approaches the top eigenvector and ‖Jv‖ approaches ρ(J).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.func import jvp

from looplab.model import LoopedTransformer
from looplab.model.attention import AttentionContext
from looplab.model.protocol import LoopedModel, LoopProbe
from looplab.model.tangent import Tangent, linearise_step

#: the JSRR estimators of :func:`jsrr_per_sample` (``none`` turns the regulariser off)
ESTIMATORS = ("none", "jvp", "vjp", "frobenius")

LoopMap = Callable[[Tensor], Tensor]


@dataclass
class ModelLoop:
    """Φ of a looped transformer: h [B, L, d] → h' [B, L, d], one loop with the injection e fixed,
    on the math attention path; J v comes from its linearisation (:mod:`looplab.model.tangent`)."""

    model: LoopedTransformer
    e: Tensor
    ctx: AttentionContext

    def __call__(self, h: Tensor) -> Tensor:
        return self.model.step(h, self.e, self.ctx)

    def linearise(self, h: Tensor) -> tuple[Tensor, Tangent]:
        """(Φ(h), v ↦ J v at h): one primal pass; each J v after it is differentiable in the parameters."""
        return linearise_step(self.model, h, self.e, self.ctx)


@dataclass
class StepLoop:
    """Φ of any model of the looped-model protocol (``looplab.model.protocol``), such as a wrapped
    pretrained model: ``model.step(h, e, ctx)`` in the context ``start`` returned; J v by forward-mode AD."""

    model: LoopedModel
    e: Tensor
    ctx: Any

    def __call__(self, h: Tensor) -> Tensor:
        return self.model.step(h, self.e, self.ctx)


def loop_map(model: LoopedModel, e: Tensor, valid: Tensor, ctx: Any = None) -> ModelLoop | StepLoop:
    """Φ for ``model`` at the injected input e [B, L, d] and validity mask [B, L].

    A :class:`LoopedTransformer` builds its context from ``valid`` (on the math attention path,
    which its linearisation needs); another protocol model runs in ``ctx`` (the context its
    ``start`` returned) or, without one, in ``model.context(valid)``.
    """
    if isinstance(model, LoopedTransformer):
        return ModelLoop(model, e, model.context(valid, use_math=True))
    return StepLoop(model, e, model.context(valid) if ctx is None else ctx)


def _per_sample_norm(x: Tensor) -> Tensor:
    return x.flatten(1).norm(dim=1)


def random_direction(
    valid: Tensor, d_model: int, generator: torch.Generator | None, unit: bool = True, dtype=torch.float32
) -> Tensor:
    """Gaussian [B, L, d] on valid positions (zero on padding), scaled to unit norm per sample if ``unit``."""
    v = torch.randn(*valid.shape, d_model, generator=generator, dtype=dtype).to(valid.device)
    v = v * valid.unsqueeze(-1)
    return v / _per_sample_norm(v).clamp_min(1e-30)[:, None, None] if unit else v


def jacobian_map(phi: LoopMap, h: Tensor, differentiable: bool = True) -> Tangent:
    """v ↦ J v at h, for as many v as asked: by Φ's linearisation (a :class:`ModelLoop`, whose primal
    runs once), or else by forward-mode AD. ``differentiable``: results carry gradients to the
    model's parameters; otherwise no graph is built. (Gradients through forward-mode AD are wrong
    for ``nn.LayerNorm``; the other maps here, the pretrained retrofit's, use RMSNorm written out.)"""
    if isinstance(phi, ModelLoop):
        if differentiable:
            return phi.linearise(h)[1]
        with torch.no_grad():
            apply = phi.linearise(h.detach())[1]
        return torch.no_grad()(apply)
    if differentiable:
        return lambda v: jvp(phi, (h,), (v,))[1]
    return lambda v: _dual_jacobian_vector(phi, h.detach(), v)


def _dual_jacobian_vector(phi: LoopMap, h: Tensor, v: Tensor) -> Tensor:
    """J v without a graph by dual tensors: about 30 % cheaper than ``torch.func.jvp`` (not used
    where the result needs a gradient: backward through the softmax's forward-mode formula is not
    supported that way)."""
    with torch.no_grad(), forward_ad.dual_level():
        return forward_ad.unpack_dual(phi(forward_ad.make_dual(h, v))).tangent


def jacobian_vector(phi: LoopMap, h: Tensor, v: Tensor) -> Tensor:
    """J v at h, differentiable with respect to the model's parameters."""
    return jacobian_map(phi, h)(v)


def vector_jacobian(phi: LoopMap, h: Tensor, v: Tensor, create_graph: bool) -> Tensor:
    """Jᵀ v at h by reverse-mode AD."""
    if not h.requires_grad:
        h = h.detach().requires_grad_(True)
    return torch.autograd.grad(phi(h), h, v, create_graph=create_graph)[0]


def power_iterate(apply: Tangent, v: Tensor, valid: Tensor, iters: int) -> Tensor:
    """``iters`` power iterations v ← Mv / ‖Mv‖ of the map ``apply`` (v ↦ Mv); returns the new v, detached."""
    mask = valid.unsqueeze(-1)
    for _ in range(iters):
        w = apply(v).detach() * mask
        v = w / _per_sample_norm(w).clamp_min(1e-30)[:, None, None]
    return v


def jsrr_per_sample(
    model: LoopedModel,
    probe: LoopProbe,
    estimator: str,
    power_iters: int = 0,
    generator: torch.Generator | None = None,
    direction: Tensor | None = None,
) -> Tensor:
    """The chosen estimator at each probe state: [B], differentiable in the model's parameters.

    Args:
        estimator: ``jvp`` (‖J v‖²), ``vjp`` (‖Jᵀ v‖²) or ``frobenius`` (‖J g‖² / D).
        power_iters: gradient-free power iterations on v before the penalty (``jvp``, ``vjp``).
        generator: draws the direction when ``direction`` is None.
        direction: [B, L, d] the v to start from (unit norm per sample, zero on padding, as
            :func:`random_direction` draws it) or the g of ``frobenius``; drawn when None.
    """
    phi = loop_map(model, probe.e, probe.valid, probe.ctx)
    mask = probe.valid.unsqueeze(-1).to(probe.h.dtype)
    d_model = probe.h.shape[-1]
    if estimator == "frobenius":
        g = (
            random_direction(probe.valid, d_model, generator, unit=False, dtype=probe.h.dtype)
            if direction is None
            else direction
        )
        dims = probe.valid.sum(1).to(probe.h.dtype) * d_model
        return (jacobian_vector(phi, probe.h, g) * mask).flatten(1).pow(2).sum(1) / dims
    if estimator not in ("jvp", "vjp"):
        raise ValueError(f"unknown JSRR estimator {estimator!r}; valid: jvp, vjp, frobenius")
    v = random_direction(probe.valid, d_model, generator, dtype=probe.h.dtype) if direction is None else direction
    if estimator == "vjp":
        h = probe.h.detach()
        v = power_iterate(lambda u: vector_jacobian(phi, h, u, create_graph=False), v, probe.valid, power_iters)
        out = vector_jacobian(phi, probe.h, v, create_graph=True)
    else:
        apply = jacobian_map(phi, probe.h)  # one primal pass serves the power iterations and the penalty
        out = apply(power_iterate(torch.no_grad()(apply), v, probe.valid, power_iters))
    return (out * mask).flatten(1).pow(2).sum(1)


@torch.no_grad()
def spectral_radius_power(
    phi: LoopMap, h: Tensor, valid: Tensor, iters: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Estimate ρ(J) per sample by power iteration from a random direction.

    Returns:
        growth [B]: the geometric mean of ‖J v_k‖ over the last half of the
        iterations (→ ρ even when the top eigenvalues are a complex pair), and
        rayleigh [B]: v·Jv at the last iterate (the signed top eigenvalue when it is real).
    """
    v = random_direction(valid, h.shape[-1], generator, dtype=h.dtype)
    growth, rayleigh, _ = power_iteration(phi, h, valid, iters, v)
    return growth, rayleigh


@torch.no_grad()
def power_iteration(phi: LoopMap, h: Tensor, valid: Tensor, iters: int, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``iters`` power iterations of J at h from the unit direction v [B, L, d]: growth [B] and
    rayleigh [B] as :func:`spectral_radius_power` defines them, and the last direction [B, L, d]
    (a warm start for the next state of a trajectory, whose Jacobian changes little)."""
    mask = valid.unsqueeze(-1)
    apply = jacobian_map(phi, h, differentiable=False)
    log_growth = []
    for _ in range(iters):
        w = apply(v) * mask
        norm = _per_sample_norm(w).clamp_min(1e-30)
        log_growth.append(norm.log())
        v = w / norm[:, None, None]
    jv = apply(v) * mask
    growth = torch.stack(log_growth[len(log_growth) // 2 :]).mean(0).exp()
    return growth, (v * jv).flatten(1).sum(1), v


def spectral_radius_exact(phi: LoopMap, h: Tensor) -> float:
    """ρ(J) for ONE sample without padding, h [1, L, d], from the full Jacobian's eigenvalues.

    Meant for tiny states: the Jacobian is (L·d) × (L·d).
    """
    shape = h.shape

    def flat_phi(x: Tensor) -> Tensor:
        return phi(x.view(shape)).reshape(-1)

    jacobian = torch.func.jacfwd(flat_phi)(h.reshape(-1)).detach().double()
    if not torch.isfinite(jacobian).all():  # a diverged state: LAPACK must not see inf or NaN
        return float("nan")
    return float(torch.linalg.eigvals(jacobian).abs().max())
