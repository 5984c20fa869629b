"""One loop and its Jacobian-vector product in a single pass: (Φ(h), J v) with J = ∂Φ/∂h.

Forward-mode AD (``torch.func.jvp``) gives the same numbers, but on models this
size its per-op bookkeeping costs more than the arithmetic: a JVP through one
loop took 4× a loop's forward and backward. Here each piece of the loop carries
its tangent by its own derivative, written out with ordinary tensor ops, so
the result is differentiable in the parameters by plain reverse mode (what the
JSRR penalty needs) and costs about two forwards. Each projection runs once on
the primal and the tangent stacked along the batch.

Rules (a dot marks a tangent; e is held fixed, so the injection's tangent is v):

    linear        y = xWᵀ + b            ẏ = ẋWᵀ
    layernorm     y = γ x̂ + β            ẏ = γ (ẋ − mean ẋ − x̂ mean(x̂ ẋ)) / σ
    rmsnorm       y = γ x / r            ẏ = γ (ẋ − x̂ mean(x̂ ẋ)) / r
    gelu          y = x Φ(x)             ẏ = (Φ(x) + x φ(x)) ẋ
    softmax       p = softmax(s)         ṗ = p ⊙ (ṡ − Σⱼ p ṡ)
    attention     y = p v                ẏ = ṗ v + p v̇,   ṡ = (q̇ kᵀ + q k̇ᵀ) / √d_h

Layer hooks (:meth:`LoopedTransformer.observe`) are not called on this path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.model.attention import AttentionContext, SelfAttention, apply_rope, attention_mask
from looplab.model.layer import Layer
from looplab.model.norms import Residual

Dual = tuple[Tensor, Tensor]  # (primal, tangent) of the same shape


def step_tangent(model, h: Tensor, v: Tensor, e: Tensor, ctx: AttentionContext) -> Dual:
    """(h_t, J v): one loop of ``model`` (a LoopedTransformer) from h [B, L, d] along v [B, L, d]."""
    x, dx = model.core_input(h, e), _injection_tangent(model, v)
    for layer in model.core:
        x, dx = layer_tangent(layer, x, dx, ctx)
    if model.core_out_norm is not None:
        x, dx = norm_tangent(model.core_out_norm, x, dx)
    return x, dx


def _injection_tangent(model, v: Tensor) -> Tensor:
    if model.inject is None:  # add or none: the state enters as it is
        return v
    return F.linear(v, model.inject.weight[:, v.shape[-1] :])  # W_I [e; h] with e fixed: the h block


def layer_tangent(layer: Layer, x: Tensor, dx: Tensor, ctx: AttentionContext) -> Dual:
    """:class:`Layer` on (x, ẋ), each [B, L, d]."""
    x, dx = residual_tangent(layer.attn_residual, x, dx, lambda y, dy: attention_tangent(layer.attn, y, dy, ctx))
    return residual_tangent(layer.mlp_residual, x, dx, lambda y, dy: mlp_tangent(layer.mlp, y, dy))


def residual_tangent(residual: Residual, x: Tensor, dx: Tensor, sublayer) -> Dual:
    """:class:`Residual` on (x, ẋ); ``sublayer`` maps a dual to a dual."""
    placement = residual.placement
    if placement == "post":
        y, dy = sublayer(x, dx)
        return norm_tangent(residual.norm_out, x + y, dx + dy)
    y, dy = sublayer(*norm_tangent(residual.norm_in, x, dx))
    if placement == "pre":
        return x + y, dx + dy
    if placement == "pre_sandwich":
        y, dy = norm_tangent(residual.norm_out, y, dy)
        return x + y, dx + dy
    return norm_tangent(residual.norm_out, x + y, dx + dy)


def norm_tangent(norm: nn.Module, x: Tensor, dx: Tensor) -> Dual:
    """LayerNorm (affine or not) or RMSNorm over the last dimension, on (x, ẋ)."""
    if isinstance(norm, nn.LayerNorm):
        variance, mean = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
        inv_scale = torch.rsqrt(variance + norm.eps)
        unit = (x - mean) * inv_scale
        dx = dx - dx.mean(-1, keepdim=True)
        weight, bias = norm.weight, norm.bias
    elif isinstance(norm, nn.RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        inv_scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        unit = x * inv_scale
        weight, bias = norm.weight, None
    else:
        raise TypeError(f"no tangent rule for {type(norm).__name__}")
    dy = torch.addcmul(dx, unit, (unit * dx).mean(-1, keepdim=True), value=-1) * inv_scale
    if weight is None:
        return unit, dy
    y = unit * weight if bias is None else torch.addcmul(bias, unit, weight)
    return y, dy * weight


def _linear_pair(linear: nn.Linear, x: Tensor, dx: Tensor) -> Dual:
    """(x Wᵀ + b, ẋ Wᵀ)."""
    return F.linear(x, linear.weight, linear.bias), F.linear(dx, linear.weight)


def mlp_tangent(mlp: nn.Sequential, x: Tensor, dx: Tensor) -> Dual:
    """Linear → GELU (exact) → Linear on (x, ẋ)."""
    inner, gelu, outer = mlp
    if gelu.approximate != "none":
        raise TypeError("the tangent rule is written for the exact (erf) GELU")
    pre, dpre = _linear_pair(inner, x, dx)
    cdf = 0.5 * (1.0 + torch.erf(pre * (1.0 / math.sqrt(2.0))))
    density = torch.exp(-0.5 * pre.pow(2)) * (1.0 / math.sqrt(2.0 * math.pi))
    return _linear_pair(outer, pre * cdf, (cdf + pre * density) * dpre)


def attention_tangent(attn: SelfAttention, x: Tensor, dx: Tensor, ctx: AttentionContext) -> Dual:
    """:class:`SelfAttention` (math path) on (x, ẋ), each [B, L, d]."""
    batch, length, d_model = x.shape
    qkv, dqkv = _linear_pair(attn.qkv, x, dx)

    def heads(t: Tensor) -> Tensor:  # [B, L, 3d] → [3, B, H, L, Dh]
        return t.view(batch, length, 3, attn.n_heads, -1).permute(2, 0, 3, 1, 4)

    qkv, dqkv = heads(qkv), heads(dqkv)
    (q, k, v), (dq, dk, dv) = qkv, dqkv
    if ctx.rope is not None:  # a fixed rotation: the tangent turns with the primal
        cos, sin = (t[:length] for t in ctx.rope)
        (q, k), (dq, dk) = apply_rope(qkv[:2], cos, sin), apply_rope(dqkv[:2], cos, sin)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale
    dscores = (dq @ k.transpose(-1, -2) + q @ dk.transpose(-1, -2)) * scale
    mask = attention_mask(ctx, length, x.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    dprobs = probs * (dscores - (probs * dscores).sum(-1, keepdim=True))
    y, dy = probs @ v, dprobs @ v + probs @ dv

    def merge(t: Tensor) -> Tensor:  # [B, H, L, Dh] → [B, L, d]
        return t.transpose(1, 2).reshape(batch, length, d_model)

    return _linear_pair(attn.out, merge(y), merge(dy))
