"""One transformer layer: attention and MLP sublayers, each with a norm placement."""

from __future__ import annotations

from torch import Tensor, nn

from looplab.config import ModelConfig
from looplab.model.attention import AttentionContext, SelfAttention
from looplab.model.norms import Residual


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.attn = SelfAttention(d, cfg.n_heads)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_ratio * d), nn.GELU(), nn.Linear(cfg.mlp_ratio * d, d))
        self.attn_residual = Residual(cfg.placement, cfg.norm, d)
        self.mlp_residual = Residual(cfg.placement, cfg.norm, d)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """x [B, L, d] → [B, L, d]."""
        x = self.attn_residual(x, lambda y: self.attn(y, ctx))
        return self.mlp_residual(x, self.mlp)
