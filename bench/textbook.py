"""A textbook looped transformer and its training step: the denominator of the step benchmarks.

This is the model as a researcher writes it by hand (GPT-style): one Linear per
projection (query, key, value, output), attention spelled out as
softmax(QKᵀ/√d_h + mask)·V, a separate LayerNorm module per norm, the input
injected by addition before every loop, every row run to the batch's depth, and
cross-entropy over the answer positions. The Jacobian regulariser is ‖vᵀJ‖² at
the last state, by one reverse-mode product with ``create_graph``. It computes
what looplab's model computes for the same weights (:func:`copy_weights`
checks that), so a ratio of step times compares implementations, not models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class TextbookConfig:
    """The model and step; ``placement`` is ``pre`` or ``post_sandwich``, ``positions`` ``learned`` or ``none``."""

    vocab_size: int
    d_model: int
    n_heads: int
    d_ff: int
    layers: int
    placement: str = "pre"
    positions: str = "none"
    causal: bool = False
    window: int = 0
    max_len: int = 512
    jsrr_weight: float = 0.0  # 0: the plain step


class TextbookAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.query, self.key, self.value, self.proj = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x [B, L, d], mask [B, 1, L, L] bool (True = may attend) → [B, L, d]."""
        batch, length, d_model = x.shape
        head_dim = d_model // self.n_heads

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, length, self.n_heads, head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, length, d_model))


class TextbookLayer(nn.Module):
    def __init__(self, cfg: TextbookConfig):
        super().__init__()
        d = cfg.d_model
        self.placement = cfg.placement
        self.attn = TextbookAttention(d, cfg.n_heads)
        self.fc_in, self.fc_out = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)
        self.norm_attn_in, self.norm_mlp_in = nn.LayerNorm(d), nn.LayerNorm(d)
        if cfg.placement == "post_sandwich":
            self.norm_attn_out, self.norm_mlp_out = nn.LayerNorm(d), nn.LayerNorm(d)

    def mlp(self, x: Tensor) -> Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if self.placement == "pre":
            x = x + self.attn(self.norm_attn_in(x), mask)
            return x + self.mlp(self.norm_mlp_in(x))
        x = self.norm_attn_out(x + self.attn(self.norm_attn_in(x), mask))
        return self.norm_mlp_out(x + self.mlp(self.norm_mlp_in(x)))


class TextbookLoopedTransformer(nn.Module):
    def __init__(self, cfg: TextbookConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positions == "learned" else None
        self.layers = nn.ModuleList(TextbookLayer(cfg) for _ in range(cfg.layers))
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, L] → e [B, L, d]."""
        x = self.embedding(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1]))
        return x

    def loop(self, h: Tensor, e: Tensor, mask: Tensor) -> Tensor:
        """One loop: h [B, L, d] → the next state [B, L, d]."""
        x = h + e
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def forward(self, tokens: Tensor, mask: Tensor, loops: int) -> tuple[Tensor, Tensor, Tensor]:
        """(logits [B, L, V] after ``loops`` loops, the last state h [B, L, d], e [B, L, d])."""
        e = self.embed(tokens)
        h = e
        for _ in range(loops):
            h = self.loop(h, e, mask)
        return self.head(self.final_norm(h)), h, e


def attention_mask(valid: Tensor, causal: bool, window: int) -> Tensor:
    """[B, 1, L, L] bool from the [B, L] validity mask; a query whose keys are all masked sees itself."""
    length = valid.shape[1]
    positions = torch.arange(length)
    offset = positions[:, None] - positions[None, :]
    allowed = torch.ones(length, length, dtype=torch.bool)
    if causal:
        allowed &= offset >= 0
    if window > 0:
        allowed &= offset.abs() <= window
    mask = valid[:, None, None, :] & allowed
    return mask | torch.eye(length, dtype=torch.bool)


def training_step(
    model: TextbookLoopedTransformer,
    optimizer: torch.optim.Optimizer,
    batch,
    depths: Tensor,
    generator: torch.Generator,
) -> float:
    """One AdamW step on ``batch`` (tokens, labels, valid [B, L]); row i is read after depths[i] loops.

    Every row runs max(depths) loops and each row's logits are taken at its own depth;
    with ``cfg.jsrr_weight`` > 0 the loss is (1 − w)·CE + w·mean ‖vᵀJ‖² at the last state.
    """
    cfg = model.cfg
    mask = attention_mask(batch.valid, cfg.causal, cfg.window)
    e = model.embed(batch.tokens)
    h, chosen = e, torch.zeros_like(e)
    for t in range(1, int(depths.max()) + 1):
        h = model.loop(h, e, mask)
        chosen = torch.where((depths == t)[:, None, None], h, chosen)
    logits = model.head(model.final_norm(chosen))
    loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
    if cfg.jsrr_weight > 0:
        valid = batch.valid[..., None].to(h.dtype)
        v = torch.randn(h.shape, generator=generator) * valid
        v = v / v.flatten(1).norm(dim=1)[:, None, None]
        (vjp,) = torch.autograd.grad(model.loop(h, e, mask), h, v, create_graph=True)
        penalty = (vjp * valid).flatten(1).pow(2).sum(1).mean()
        loss = (1 - cfg.jsrr_weight) * loss + cfg.jsrr_weight * penalty
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


def copy_weights(source, target: TextbookLoopedTransformer) -> None:
    """Load a looplab ``LoopedTransformer`` (add injection, no prelude or coda) into ``target``."""
    with torch.no_grad():
        target.embedding.weight.copy_(source.embedding.weight)
        if target.positions is not None:
            target.positions.weight.copy_(source.positions.weight)
        for mine, theirs in zip(target.layers, source.core):
            for linear, weight, bias in zip(
                (mine.attn.query, mine.attn.key, mine.attn.value),
                theirs.attn.qkv.weight.chunk(3),
                theirs.attn.qkv.bias.chunk(3),
            ):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
            pairs = [
                (mine.attn.proj, theirs.attn.out),
                (mine.fc_in, theirs.mlp[0]),
                (mine.fc_out, theirs.mlp[2]),
                (mine.norm_attn_in, theirs.attn_residual.norm_in),
                (mine.norm_mlp_in, theirs.mlp_residual.norm_in),
            ]
            if mine.placement == "post_sandwich":
                pairs += [
                    (mine.norm_attn_out, theirs.attn_residual.norm_out),
                    (mine.norm_mlp_out, theirs.mlp_residual.norm_out),
                ]
            for module, other in pairs:
                module.load_state_dict(other.state_dict())
        target.final_norm.load_state_dict(source.final_norm.state_dict())
        target.head.load_state_dict(source.head.state_dict())
