"""Multi-head self-attention with RoPE, padding masks, and two kernels.

``sdpa`` uses :func:`torch.nn.functional.scaled_dot_product_attention`;
``math`` spells the softmax out, which forward-mode AD (JVP) can differentiate
on CPU and which can hand back the attention probabilities for analysis.
``auto`` (the default) picks per call by :func:`prefers_math`.
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


#: on a multi-threaded CPU, sequences shorter than this may attend by the math kernel under ``attention = "auto"``
MATH_BELOW = 64
#: ... when their heads have at least this many channels, or the sequence at least half of MATH_BELOW positions
MATH_MIN_HEAD_DIM = 32


def prefers_math(length: int, head_dim: int, device: torch.device, threads: int | None = None) -> bool:
    """Whether the ``auto`` kernel is the math one for a sequence of ``length`` on ``device``.

    Measured with ``bench/attention.py`` (forward and backward of the attention module, batch
    64, 4 heads of 16 or 32 channels, L = 8..256, bidirectional, and causal with right padding)
    on an AMD EPYC. At 2 threads the math kernel took 0.74–0.96× SDPA's time for L < 64 with
    32-channel heads, and for 32 ≤ L < 64 with 16-channel heads, but 1.05–1.19× for 16-channel
    heads at L ≤ 16; from L = 96 SDPA took 0.28–0.84× the math kernel's time. At 1 thread SDPA
    took 0.67–1.07× the math kernel's time at every length: the fused kernel gains little from a
    second thread on short sequences, the batched matmuls of the math kernel do. The training
    steps agree: at 2 threads the STARS toy (32-channel heads, L 17) steps 10–16 % faster on the
    math kernel, the stopping preset (16-channel heads, L ≤ 12) 9 % faster on SDPA.

    So, on a CPU with more than one thread (``threads``, default torch's) and L below
    :data:`MATH_BELOW`: the math kernel for heads of :data:`MATH_MIN_HEAD_DIM` channels or more,
    or for L ≥ MATH_BELOW / 2; SDPA otherwise and on every GPU. The two differ by float rounding
    only (the tests hold them to 1e-4), but a run resumed at another thread count may take the
    other kernel.
    """
    threads = torch.get_num_threads() if threads is None else threads
    if torch.device(device).type != "cpu" or threads < 2 or length >= MATH_BELOW:
        return False
    return head_dim >= MATH_MIN_HEAD_DIM or 2 * length >= MATH_BELOW


@dataclass
class AttentionContext:
    """Per-batch attention inputs shared by every layer and loop.

    Attributes:
        mask: [B, 1, L, L] bool (True = may attend), or None when nothing is masked.
        causal: whether attention is causal (folded into ``mask`` when a mask exists).
        rope: (cos, sin) tables [L, Dh], or None without RoPE.
        use_math: force the math kernel (needed for forward-mode AD, and to observe the attention
            probabilities through :attr:`SelfAttention.weights`).
        causal_suffices: the mask is causal plus right padding, so on every valid query the
            causal kernel without a mask computes the same (faster: no mask to materialise per
            call); the fused path then drops the mask, and only padded queries differ
            (they attend to their valid prefix and the padding up to themselves).
        record: when a dict, each attention module called stores its keys and values there (after
            RoPE), ``record[module] = (k, v)`` [B, H, L, Dh], the last call's standing.
        earlier: when a dict, an attention module found in it attends to the keys and values
            ``earlier[module]`` [B, H, L, Dh] for every earlier position and to its own for itself
            (:func:`attend_earlier`): the ``shared`` cache's view, for training in it.
    """

    mask: Tensor | None
    causal: bool
    rope: tuple[Tensor, Tensor] | None
    use_math: bool = False
    causal_suffices: bool = False
    record: dict | None = None
    earlier: dict | None = None

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
        # with right padding, every key a valid causal query may see (j ≤ i) is valid
        causal_suffices = causal and window == 0 and mask is not None and _right_padded(valid)
        return AttentionContext(mask, causal, rope, use_math, causal_suffices=causal_suffices)

    def select(self, rows: Tensor | slice) -> AttentionContext:
        """The context restricted to some rows of the batch (an index tensor, boolean mask or slice)."""
        earlier = None
        if self.earlier is not None:
            earlier = {module: (k[rows], v[rows]) for module, (k, v) in self.earlier.items()}
        return replace(self, mask=None if self.mask is None else self.mask[rows], earlier=earlier)


def _right_padded(valid: Tensor) -> bool:
    """Whether each row of a [B, L] validity mask is a prefix (its padding, if any, at the end)."""
    positions = torch.arange(valid.shape[1], device=valid.device)
    return bool((valid == (positions < valid.sum(1, keepdim=True))).all())


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


def attend_earlier(
    q: Tensor, k: Tensor, v: Tensor, k_earlier: Tensor, v_earlier: Tensor, ctx: AttentionContext
) -> Tensor:
    """Causal attention in which query i reads position j < i through ``k_earlier``, ``v_earlier`` and itself
    through its own k, v (all [B, H, L, Dh]) → [B, H, L, Dh]. With the keys and values of each earlier
    position's last loop as ``k_earlier``, ``v_earlier``, this is what the ``shared`` KV cache gives a token
    at every loop (docs/methods.md §9). The mask is the context's (or a causal one) without its diagonal."""
    length = q.shape[2]
    before = torch.ones(length, length, dtype=torch.bool, device=q.device).tril(-1)
    if ctx.mask is not None:
        before = ctx.mask & before
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ k_earlier.transpose(-1, -2) * scale).masked_fill(~before, float("-inf"))
    own = (q * k).sum(-1, keepdim=True) * scale  # [B, H, L, 1]: every query reads itself, so no row is empty
    probs = torch.cat([scores, own], dim=-1).softmax(dim=-1)
    return probs[..., :length] @ v_earlier + probs[..., length:] * v


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


class AttentionWeights(nn.Module):
    """The identity on the attention probabilities [B, H, L, L] of the math kernel: a site to observe them
    with a forward hook (``layer.attn.weights.register_forward_hook``) without the layer returning them."""

    def forward(self, probs: Tensor) -> Tensor:
        return probs


class SelfAttention(nn.Module):
    """Multi-head self-attention; under the math kernel its probabilities pass through ``weights``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.weights = AttentionWeights()

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """x [B, L, d] → [B, L, d]."""
        batch, length, d_model = x.shape
        q, k, v = split_heads(self.qkv(x), self.n_heads, ctx.rope)
        if ctx.record is not None:
            ctx.record[self] = (k, v)
        if ctx.earlier is not None and self in ctx.earlier:
            y = attend_earlier(q, k, v, *ctx.earlier[self], ctx)
        elif ctx.use_math or self.weights._forward_hooks:  # an observer of the probabilities needs them formed
            y = self.weights(attention_probs(q, k, ctx)) @ v
        else:
            mask = None if ctx.causal_suffices else ctx.mask
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=ctx.causal and mask is None)
        return self.out(y.transpose(1, 2).reshape(batch, length, d_model))
