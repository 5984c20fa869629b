"""Attention across loops: how much A_{ℓ,t} still changes, and the Lipschitz bound (docs/methods.md §7).

Cross-loop difference, per core layer ℓ (batch mean of a per-sample Frobenius norm
over heads, queries and keys):

    D_ℓ[t, t′] = ‖A_{ℓ,t} − A_{ℓ,t′}‖_F                                   [layers, loops, loops]

Bound. Let X be the input of layer ℓ's attention ([T, d] per sample; for pre-norm
and sandwich placements this is the *normalised* state N(x), for post-norm the
raw state), W_Q,h, W_K,h ∈ R^{d×d_h} head h's query/key maps and b_Q,h, b_K,h their
biases. Folding the biases into X̃ = [X, 1] and W̃ = [W; b], the scores are
Z_h = X̃ W̃_Q W̃_Kᵀ X̃ᵀ / √d_h, so for two loops t, t′

    ΔZ_h = (ΔX̃ M̃ X̃ᵀ + X̃′ M̃ ΔX̃ᵀ) / √d_h,   ‖ΔZ_h‖_F ≤ (2 B κ_h / √d_h) ‖ΔX‖_F

with κ_h = ‖W̃_Q,h W̃_K,hᵀ‖₂ (docs/methods.md §7's ‖W_Q W_Kᵀ‖, biases included) and
B = max(‖X̃_t‖₂, ‖X̃_t′‖₂), the *spectral* norm of the [T, d+1] input (a bound on
the max row norm ρ alone is not enough: ‖X‖₂ ≤ √T ρ). Row-wise softmax has a
Jacobian diag(s) − ssᵀ of spectral norm ≤ 1/2, and masking only drops entries, so

    ‖ΔA_h‖_F ≤ (1/2) · (2 B κ_h / √d_h) · ‖ΔX‖_F.

With RoPE the product W̃_Q R_{j−i} W̃_Kᵀ depends on the position pair, so the
check uses κ_h = ‖W̃_Q,h‖₂ ‖W̃_K,h‖₂ and B = max(‖X̃_t‖_F, ‖X̃_t′‖_F) instead
(Σ_ij ‖Δx_i‖²‖x_j‖² = ‖ΔX‖_F²‖X‖_F²), which is again a valid bound.

The bound needs scores that are exactly X̃ W̃_Q R W̃_Kᵀ X̃ᵀ / √d_h: a looplab model's attention, and
transformers' attention with plain ``q_proj`` / ``k_proj`` Linear maps and RoPE (Llama, Mistral,
Qwen2, HRM-Text; grouped key-value heads included, head h reading key head h // group). Where the
scores are something else — query/key norms (Qwen3), clipped or position-scaled queries and
relative biases (Inkling-2) — :func:`head_geometry` says None and no bound is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from looplab.model.looped import LoopedTransformer
from looplab.model.protocol import LoopedModel
from looplab.model.trace import Trace

__all__ = [
    "attention_difference",
    "consecutive_attention_difference",
    "LipschitzCheck",
    "head_kappa",
    "head_geometry",
    "lipschitz_check",
]


def attention_difference(attn: Tensor) -> Tensor:
    """D_ℓ[t, t′] for attn [loops, layers, B, H, T, T]: [layers, loops, loops] (batch mean)."""
    flat = attn.double().permute(1, 2, 0, 3, 4, 5).flatten(3)  # [layers, B, loops, H·T·T]
    return torch.cdist(flat, flat).mean(1).to(attn.dtype)


def consecutive_attention_difference(attn: Tensor) -> Tensor:
    """D_ℓ[t, t − 1] for t = 2..loops: [layers, loops − 1] (batch mean), without the loops × loops matrix.

    The difference is taken in the stored dtype (for float32 probabilities it is exact up to
    one rounding) and its norm accumulated in float64.
    """
    delta = (attn[1:] - attn[:-1]).flatten(-3).double().norm(dim=-1)  # [loops − 1, layers, B]
    return delta.mean(-1).transpose(0, 1).to(attn.dtype)


def head_kappa(weight: Tensor, bias: Tensor | None, n_heads: int, rope: bool) -> Tensor:
    """κ_h per head from a qkv Linear's weight [3d, d] and bias [3d]: [H] (see the module docstring)."""
    d_model = weight.shape[1]
    head_dim = d_model // n_heads
    weight = weight.double()
    bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device) if bias is None else bias.double()
    augmented = torch.cat([weight, bias[:, None]], dim=1)  # [3d, d+1]: x̃ ↦ W̃ x̃
    kappas = []
    for h in range(n_heads):
        query = augmented[h * head_dim : (h + 1) * head_dim].T  # [d+1, d_h]
        key = augmented[d_model + h * head_dim : d_model + (h + 1) * head_dim].T  # [d+1, d_h]
        if rope:
            kappas.append(torch.linalg.matrix_norm(query, 2) * torch.linalg.matrix_norm(key, 2))
        else:
            kappas.append(torch.linalg.matrix_norm(query @ key.T, 2))
    return torch.stack(kappas)


def _rope_head_kappa(query: nn.Linear, key: nn.Linear, head_dim: int) -> Tensor:
    """κ_h = ‖W̃_Q,h‖₂ ‖W̃_K,g(h)‖₂ per query head of separate query / key Linear maps under RoPE, with
    grouped key-value heads (g(h) = h // (query heads / key heads)): [H]."""

    def per_head(linear: nn.Linear) -> Tensor:
        weight = linear.weight.double()
        bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        if linear.bias is not None:
            bias = linear.bias.double()
        augmented = torch.cat([weight, bias[:, None]], dim=1).unflatten(0, (-1, head_dim))  # [heads, d_h, d+1]
        return torch.linalg.matrix_norm(augmented, 2)

    queries, keys = per_head(query), per_head(key)
    group = len(queries) // len(keys)
    return queries * keys.repeat_interleave(group)


def head_geometry(model: LoopedModel, layer: int) -> tuple[Tensor, int, bool] | None:
    """(κ_h [H], d_h, rope) of core layer ``layer``'s attention, or None where its scores are not of the
    bound's form (see the module docstring)."""
    if isinstance(model, LoopedTransformer):
        rope, n_heads = model.cfg.positional == "rope", model.cfg.n_heads
        qkv = model.core[layer].attn.qkv
        return head_kappa(qkv.weight, qkv.bias, n_heads, rope), model.cfg.d_model // n_heads, rope
    attention = getattr(model.core[layer], "self_attn", None)
    query, key = getattr(attention, "q_proj", None), getattr(attention, "k_proj", None)
    head_dim = getattr(attention, "head_dim", None)
    plain = isinstance(query, nn.Linear) and isinstance(key, nn.Linear) and isinstance(head_dim, int)
    if not plain or hasattr(attention, "q_norm") or hasattr(attention, "k_norm"):
        return None
    if not math.isclose(getattr(attention, "scaling", 0.0), head_dim**-0.5):
        return None
    return _rope_head_kappa(query, key, head_dim), head_dim, True


@dataclass
class LipschitzCheck:
    """The bound at consecutive recorded loops (pairs t−1, t) of every recorded core layer.

    Attributes (P = recorded loops − 1):
        delta_attn: ‖A_{ℓ,t,h} − A_{ℓ,t−1,h}‖_F, [layers, P, B, H].
        delta_input: ‖X_{ℓ,t} − X_{ℓ,t−1}‖_F of the attention input, [layers, P, B].
        input_bound: B, [layers, P, B].
        kappa: κ_h, [layers, H].
        bound: (1/2)(2Bκ_h/√d_h)‖ΔX‖_F, [layers, P, B, H].
        ratio: delta_attn / bound (0 where both vanish), [layers, P, B, H].
        holds: delta_attn ≤ bound + atol, [layers, P, B, H] bool.
    """

    delta_attn: Tensor
    delta_input: Tensor
    input_bound: Tensor
    kappa: Tensor
    bound: Tensor
    ratio: Tensor
    holds: Tensor


@torch.no_grad()
def lipschitz_check(model: LoopedModel, recorded: Trace, atol: float = 1e-6) -> LipschitzCheck | None:
    """Check ‖ΔA‖ ≤ (1/2)(2Bκ/√d_h)‖ΔX‖ on a trace recorded with ``attention=True``; None when a recorded
    layer's attention is not of the bound's form (:func:`head_geometry`)."""
    geometry = [head_geometry(model, layer) for layer in recorded.layers]
    if not geometry or any(g is None for g in geometry):
        return None
    rope = geometry[0][2]
    attn = recorded.attention()  # [loops, layers, B, H, T, T]
    inputs = recorded.attention_inputs().double()  # [loops, layers, B, T, d]
    augmented = torch.cat([inputs, torch.ones_like(inputs[..., :1])], dim=-1)
    if rope:
        size = torch.linalg.matrix_norm(augmented, "fro")  # [loops, layers, B]
    else:
        size = torch.linalg.matrix_norm(augmented, 2)
    input_bound = torch.maximum(size[1:], size[:-1]).transpose(0, 1)  # [layers, P, B]
    delta_input = (inputs[1:] - inputs[:-1]).flatten(-2).norm(dim=-1).transpose(0, 1)
    # The difference in the stored dtype (exact up to one rounding), its norm in float64.
    delta_attn = (attn[1:] - attn[:-1]).flatten(-2).double().norm(dim=-1).transpose(0, 1)  # [layers, P, B, H]
    kappa = torch.stack([kappa for kappa, _, _ in geometry]).to(attn.device)  # [layers, H]
    root_dim = torch.tensor([math.sqrt(d) for _, d, _ in geometry], dtype=kappa.dtype, device=attn.device)
    bound = 0.5 * (2 * input_bound[..., None] * kappa[:, None, None, :] / root_dim[:, None, None, None])
    bound = bound * delta_input[..., None]
    ratio = torch.where(
        bound > 0,
        delta_attn / bound.clamp_min(1e-300),
        torch.where(delta_attn > 0, torch.full_like(bound, float("inf")), torch.zeros_like(bound)),
    )
    return LipschitzCheck(delta_attn, delta_input, input_bound, kappa, bound, ratio, delta_attn <= bound + atol)
