"""Multi-head self-attention with RoPE, padding masks, and two kernels.

``sdpa`` uses :func:`torch.nn.functional.scaled_dot_product_attention` (fast);
``math`` spells the softmax out, which forward-mode AD (JVP) can differentiate
on CPU and which can hand back the attention probabilities for analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rope_tables(length: int, head_dim: int, base: float, device, dtype) -> tuple[Tensor, Tensor]:
    """The cos and signed sin tables, each [L, head_dim], of rotary position embedding.

    Channel i and i + head_dim/2 form a rotated pair (the "rotate half" layout),
    so both tables repeat their head_dim/2 frequencies twice; the sin table's
    first half is negated, as :func:`apply_rope` expects.
    """
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
    sin = angles.sin()
    return angles.cos().repeat(1, 2).to(dtype), torch.cat((-sin, sin), dim=1).to(dtype)


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + Dh/2) of x [..., L, Dh] by position-dependent angles.

    (x₁, x₂) ↦ (x₁ cos − x₂ sin, x₂ cos + x₁ sin): the swapped halves are one ``roll``,
    and the sign sits in the table, which costs two fewer kernels than negating and concatenating.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


@dataclass
class AttentionContext:
    """Per-batch attention inputs shared by every layer and loop.

    Attributes:
        mask: [B, 1, L, L] bool (True = may attend), or None when nothing is masked.
        causal: whether attention is causal (folded into ``mask`` when a mask exists).
        rope: (cos, sin) tables [L, Dh], or None without RoPE.
        use_math: force the math kernel (needed for forward-mode AD).
        probs: if a list, each attention call appends its probabilities [B, H, L, L].
    """

    mask: Tensor | None
    causal: bool
    rope: tuple[Tensor, Tensor] | None
    use_math: bool = False
    probs: list | None = None

    @staticmethod
    def build(
        valid: Tensor, causal: bool, rope: tuple[Tensor, Tensor] | None, use_math: bool, window: int = 0
    ) -> AttentionContext:
        """Context for a [B, L] validity mask; padded keys are never attended.

        ``window`` w > 0 restricts position i to keys j with |i − j| ≤ w (with ``causal``,
        0 ≤ i − j ≤ w): information then moves at most w positions per layer.
        """
        length = valid.shape[1]
        allowed = None
        if causal:
            allowed = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
        if window > 0:
            offset = torch.arange(length, device=valid.device)
            band = (offset[:, None] - offset[None, :]).abs() <= window
            allowed = band if allowed is None else allowed & band
        mask = None
        if not bool(valid.all()):
            mask = valid[:, None, None, :].expand(-1, 1, length, -1)
            if allowed is not None:
                mask = mask & allowed
            if window > 0:  # a padding query may find no valid key in its window: it attends to itself
                mask = mask | torch.eye(length, dtype=torch.bool, device=valid.device)
        elif window > 0:
            mask = allowed.expand(len(valid), 1, length, length)
        return AttentionContext(mask, causal, rope, use_math)

    def select(self, rows: Tensor | slice) -> AttentionContext:
        """The context restricted to some rows of the batch (an index tensor, boolean mask or slice)."""
        return replace(self, mask=None if self.mask is None else self.mask[rows])


def attention_probs(q: Tensor, k: Tensor, ctx: AttentionContext) -> Tensor:
    """softmax(q kᵀ / √Dh) under the context's mask (or a causal one): q, k [B, H, L, Dh] → [B, H, L, L]."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = ctx.mask
    if mask is None and ctx.causal:
        length = q.shape[2]
        mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


def split_heads(qkv: Tensor, n_heads: int, rope: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
    """The fused projection [B, L, 3d] → q, k, v, each [B, H, L, Dh] (views), q and k rotated by ``rope``."""
    batch, length, _ = qkv.shape
    qkv = qkv.view(batch, length, 3, n_heads, -1).permute(2, 0, 3, 1, 4)
    if rope is None:
        return tuple(qkv.unbind(0))
    # split, not indexing: its backward is one concatenation, where a slice and an index each
    # fill a zero tensor the size of qkv; and one RoPE call for q and k halves its kernels
    qk, v = qkv.split([2, 1])
    q, k = apply_rope(qk, *(t[:length] for t in rope))
    return q, k, v.squeeze(0)


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """x [B, L, d] → [B, L, d]."""
        batch, length, d_model = x.shape
        q, k, v = split_heads(self.qkv(x), self.n_heads, ctx.rope)
        if ctx.use_math or ctx.probs is not None:
            y = self._math(q, k, v, ctx)
        else:
            is_causal = ctx.causal and ctx.mask is None
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask, is_causal=is_causal)
        return self.out(y.transpose(1, 2).reshape(batch, length, d_model))

    def _math(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        probs = attention_probs(q, k, ctx)
        if ctx.probs is not None:
            ctx.probs.append(probs.detach())
        return probs @ v
