"""Massive activations and the MLP-zeroing ablation (docs/methods.md §7).

Massive-activation ratio of a state X (over valid tokens and all channels):

    R = max |X_{i,c}| / median |X_{i,c}|

A few channels of a few tokens (often the attention-sink token) grow orders of
magnitude above the rest; R per (loop, layer) shows where they appear. The
ablation zeroes one core layer's MLP output in every loop (a forward hook on
``layer.mlp`` that returns zeros) and re-measures ColSum concentration: if the
sink stages vanish, that MLP writes the massive activations that create them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from looplab.analysis.colsum import colsum_trace
from looplab.analysis.trace import trace
from looplab.model.looped import LoopedTransformer

__all__ = ["massive_ratio", "massive_activations", "zero_mlp", "colsum_mlp_ablation"]


def massive_ratio(x: Tensor, valid: Tensor | None = None) -> Tensor:
    """R for x [..., B, T, d] over its last three dims (valid [B, T] selects tokens): [...]."""
    magnitude = x.double().abs()
    if valid is not None:
        magnitude = magnitude[..., valid.to(x.device), :]  # [..., N_valid, d]
    flat = magnitude.flatten(-2) if valid is not None else magnitude.flatten(-3)
    return (flat.max(-1).values / flat.median(-1).values.clamp_min(1e-30)).to(x.dtype)


def massive_activations(states: Tensor, valid: Tensor | None = None) -> Tensor:
    """R of every X_{ℓ,t} in states [loops, layers, B, T, d]: [loops, layers]."""
    return massive_ratio(states, valid)


@contextmanager
def zero_mlp(model: LoopedTransformer, layer: int) -> Iterator[nn.Module]:
    """Within the block, core layer ``layer``'s MLP outputs zeros; the hook is removed afterwards."""
    mlp = model.core[layer].mlp
    handle = mlp.register_forward_hook(lambda _module, _args, output: torch.zeros_like(output))
    try:
        yield mlp
    finally:
        handle.remove()


@torch.no_grad()
def colsum_mlp_ablation(
    model: LoopedTransformer, tokens: Tensor, valid: Tensor, loops: int, layer: int
) -> tuple[Tensor, Tensor]:
    """ColSum concentration [loops, layers, H] without and with core layer ``layer``'s MLP zeroed."""
    base = colsum_trace(trace(model, tokens, valid, loops, attention=True))
    with zero_mlp(model, layer):
        ablated = colsum_trace(trace(model, tokens, valid, loops, attention=True))
    return base, ablated
