"""Norm types, and the residual wrapper that applies a registered norm placement (``looplab.model.placements``)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from looplab.model.placements import placement as registered_placement


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
        self.rule = rule = registered_placement(placement)
        self.norm_in = make_norm(norm, d_model) if rule.norm_in else None
        self.norm_out = make_norm(norm, d_model) if rule.norm_out else None

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.rule.apply(x, sublayer, self.norm_in, self.norm_out)
