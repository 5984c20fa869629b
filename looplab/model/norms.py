"""Norm types and the four residual placements of docs/methods.md §1.

For a sublayer f and norms N, N₁, N₂:

    pre            x + f(N(x))
    post           N(x + f(x))
    pre_sandwich   x + N₂(f(N₁(x)))      (Ouro's "sandwich output")
    post_sandwich  N₂(x + f(N₁(x)))      (Huginn's "sandwich residual"; the STARS default)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


def make_norm(kind: str, d_model: int) -> nn.Module:
    """``layernorm`` (affine), ``rmsnorm`` (learned scale) or ``simplenorm`` (no parameters)."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model)
    if kind == "simplenorm":
        return nn.LayerNorm(d_model, elementwise_affine=False)
    raise ValueError(f"unknown norm {kind!r}")


class Residual(nn.Module):
    """Wrap a sublayer with a norm placement. ``sublayer`` maps [B, L, d] to [B, L, d]."""

    def __init__(self, placement: str, norm: str, d_model: int):
        super().__init__()
        self.placement = placement
        self.norm_in = make_norm(norm, d_model) if placement != "post" else None
        self.norm_out = make_norm(norm, d_model) if placement != "pre" else None

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.placement == "pre":
            return x + sublayer(self.norm_in(x))
        if self.placement == "post":
            return self.norm_out(x + sublayer(x))
        if self.placement == "pre_sandwich":
            return x + self.norm_out(sublayer(self.norm_in(x)))
        return self.norm_out(x + sublayer(self.norm_in(x)))
