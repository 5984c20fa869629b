"""One loop linearised at a state: Φ(h) and the map v ↦ J v, with J = ∂Φ/∂h.

Forward-mode AD (``torch.func.jvp``) gives the same numbers, but on models this
size its per-op bookkeeping costs more than the arithmetic (a JVP through one
loop took 4× a loop's forward and backward), and reverse mode through its
``layer_norm`` rule treats the norm's mean and variance as constants, which
gives wrong parameter gradients. Here the primal runs once and keeps what each
piece's derivative needs; J v is then ordinary tensor ops on v, differentiable
in the parameters by plain reverse mode (what the JSRR penalty needs), and
applying it again (power iteration) reuses the primal.

Rules (a dot marks a tangent; e is held fixed, so the injection's tangent is v):

    linear        y = xWᵀ + b              ẏ = ẋWᵀ
    layernorm     y = γ (x − μ)/σ + β      ẏ = γ J_N ẋ, J_N symmetric: LayerNorm's backward kernel
    rmsnorm       y = γ x / r              ẏ = γ (ẋ − x̂ mean(x̂ ẋ)) / r,  x̂ = x / r
    gelu          y = GELU(x)              ẏ = GELU'(x) ẋ: GELU's backward kernel
    softmax       p = softmax(s)           ṗ = (diag p − p pᵀ) ṡ, symmetric: softmax's backward kernel
    attention     y = p v                  ẏ = ṗ v + p v̇,   ṡ = (q̇ kᵀ + q k̇ᵀ) / √d_h

Those backward kernels are themselves differentiable (PyTorch's double
backward), with the norm statistics' dependence on x accounted for.

Layer hooks (:meth:`LoopedTransformer.observe`) are not called on this path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.model.attention import AttentionContext, SelfAttention, attention_probs, split_heads
from looplab.model.contractive import ContractiveInjection
from looplab.model.layer import Layer
from looplab.model.norms import Residual
from looplab.model.placements import Dual

#: v ↦ J v for the piece linearised, on tensors shaped like its input
Tangent = Callable[[Tensor], Tensor]
Linearised = tuple[Tensor, Tangent]  # (the piece's output, its tangent map)


def linearise_step(model, h: Tensor, e: Tensor, ctx: AttentionContext) -> Linearised:
    """(h_t, v ↦ J v): one loop of ``model`` (a LoopedTransformer) from h [B, L, d], linearised at h."""
    if model.two_state:
        return linearise_two_state_step(model, h, e, ctx)
    x, core = linearise_core(model, model.core_input(h, e), ctx)
    return x, _chain([_injection_tangent(model), core])


def linearise_two_state_step(model, h: Tensor, e: Tensor, ctx: AttentionContext) -> Linearised:
    """TRM's loop from h = [y ; z] [B, L, 2d]: z_i = C(e + y + z_{i−1}) n times, then y' = C(y + z_n), so

    ż_i = J_i (ẏ + ż_{i−1}),   ẏ' = J_y (ẏ + ż_n),   and the tangent of [y ; z] is [ẏ' ; ż_n].
    """
    y, z = h.chunk(2, dim=-1)
    latent = []
    for _ in range(model.cfg.latent_steps):
        z, tangent = linearise_core(model, e + y + z, ctx)
        latent.append(tangent)
    y, answer = linearise_core(model, y + z, ctx)

    def apply(v: Tensor) -> Tensor:
        vy, vz = v.chunk(2, dim=-1)
        for tangent in latent:
            vz = tangent(vy + vz)
        return torch.cat([answer(vy + vz), vz], dim=-1)

    return torch.cat([y, z], dim=-1), apply


def linearise_core(model, x: Tensor, ctx: AttentionContext) -> Linearised:
    """The shared core once (its layers, then core_out_norm when configured) at its input x [B, L, d]."""
    maps = []
    for layer in model.core:
        x, tangent = linearise_layer(layer, x, ctx)
        maps.append(tangent)
    if model.core_out_norm is not None:
        x, tangent = linearise_norm(model.core_out_norm, x)
        maps.append(tangent)
    return x, _chain(maps)


def _chain(maps: list[Tangent]) -> Tangent:
    def apply(v: Tensor) -> Tensor:
        for tangent in maps:
            v = tangent(v)
        return v

    return apply


def _injection_tangent(model) -> Tangent:
    if model.inject is None:  # add or none: the state enters as it is
        return lambda v: v
    if isinstance(model.inject, ContractiveInjection):  # Ā h + B̄ e, e fixed: Ā
        return lambda v: model.inject.decay() * v
    return lambda v: F.linear(v, model.inject.weight[:, v.shape[-1] :])  # W_I [e; h], e fixed: the h block


def linearise_layer(layer: Layer, x: Tensor, ctx: AttentionContext) -> Linearised:
    """:class:`Layer` at x [B, L, d]."""
    x, attention = linearise_residual(layer.attn_residual, x, lambda y: linearise_attention(layer.attn, y, ctx))
    x, mlp = linearise_residual(layer.mlp_residual, x, lambda y: linearise_mlp(layer.mlp, y))
    return x, _chain([attention, mlp])


def linearise_residual(residual: Residual, x: Tensor, sublayer: Callable[[Tensor], Linearised]) -> Linearised:
    """:class:`Residual` at x; ``sublayer`` linearises the wrapped sublayer at its input. The placement's own
    function, applied to duals, composes the pieces' tangents (``looplab.model.placements``)."""

    def norm(module: nn.Module | None):
        return None if module is None else Dual.lift(lambda y: linearise_norm(module, y))

    out = residual.rule.apply(Dual.identity(x), Dual.lift(sublayer), norm(residual.norm_in), norm(residual.norm_out))
    return out.value, out.tangent


def linearise_norm(norm: nn.Module, x: Tensor) -> Linearised:
    """LayerNorm (affine or not) or RMSNorm over the last dimension, at x."""
    if isinstance(norm, nn.LayerNorm):
        shape, weight = norm.normalized_shape, norm.weight
        y, mean, rstd = torch.native_layer_norm(x, shape, weight, norm.bias, norm.eps)

        def layernorm(dx: Tensor) -> Tensor:
            dy = torch.ops.aten.native_layer_norm_backward(dx, x, shape, mean, rstd, None, None, [True, False, False])
            return dy[0] if weight is None else dy[0] * weight

        return y, layernorm
    if not isinstance(norm, nn.RMSNorm):
        raise TypeError(f"no tangent rule for {type(norm).__name__}")
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    inv_scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    unit = x * inv_scale

    def rmsnorm(dx: Tensor) -> Tensor:
        return torch.addcmul(dx, unit, (unit * dx).mean(-1, keepdim=True), value=-1) * inv_scale * norm.weight

    return unit * norm.weight, rmsnorm


def linearise_mlp(mlp: nn.Sequential, x: Tensor) -> Linearised:
    """Linear → GELU → Linear at x."""
    inner, gelu, outer = mlp
    pre = inner(x)

    def tangent(dx: Tensor) -> Tensor:
        dpre = F.linear(dx, inner.weight)
        return F.linear(torch.ops.aten.gelu_backward(dpre, pre, approximate=gelu.approximate), outer.weight)

    return outer(F.gelu(pre, approximate=gelu.approximate)), tangent


def linearise_attention(attn: SelfAttention, x: Tensor, ctx: AttentionContext) -> Linearised:
    """:class:`SelfAttention` (math path) at x [B, L, d]."""
    batch, length, d_model = x.shape

    def heads(t: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # RoPE is a fixed rotation: the tangent turns too
        return split_heads(t, attn.n_heads, ctx.rope)

    def merge(t: Tensor) -> Tensor:  # [B, H, L, Dh] → [B, L, d]
        return t.transpose(1, 2).reshape(batch, length, d_model)

    q, k, v = heads(attn.qkv(x))
    probs = attention_probs(q, k, ctx)
    scale = 1.0 / math.sqrt(q.shape[-1])

    def tangent(dx: Tensor) -> Tensor:
        dq, dk, dv = heads(F.linear(dx, attn.qkv.weight))
        dscores = (dq @ k.transpose(-1, -2) + q @ dk.transpose(-1, -2)) * scale
        dprobs = torch.ops.aten._softmax_backward_data(dscores, probs, -1, probs.dtype)
        return F.linear(merge(dprobs @ v + probs @ dv), attn.out.weight)

    return attn.out(merge(probs @ v)), tangent
