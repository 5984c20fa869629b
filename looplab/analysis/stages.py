"""Stages of inference per loop, held against a feed-forward model's (docs/methods.md §7).

The ColSum concentration C of each core layer (:mod:`looplab.analysis.colsum`), read
loop by loop, is a loop's **stage curve** c_t = (C_{t,1}, …, C_{t,k}). A feed-forward
model of equal effective depth has one curve over its K core layers; resampled to k
points as the means of consecutive blocks of K/k layers, it is the **reference** a
loop is compared with:

    alignment  a_t = Pearson(c_t, reference)        (NaN when either curve is constant)
    amplitude  A_t = max_ℓ C_{t,ℓ} − min_ℓ C_{t,ℓ}

High alignment with a large amplitude is the paper's claim that every loop repeats
the feed-forward stages; repetition alone (loop-to-loop correlation) does not carry it.

Also here: the attention mass on the first position (the start token, where sinks
form), the largest activation, and the distance of each state to a late state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "block_means",
    "stage_alignment",
    "stage_amplitude",
    "sink_mass",
    "top_activation",
    "distance_to_state",
]


def block_means(curve: Tensor, points: int) -> Tensor:
    """``curve`` [K] resampled to ``points`` values, the means of consecutive blocks of K / points entries."""
    if points < 1 or curve.shape[-1] % points:
        raise ValueError(f"a curve of {curve.shape[-1]} layers does not split into {points} equal blocks")
    return curve.reshape(*curve.shape[:-1], points, -1).mean(-1)


def stage_alignment(curves: Tensor, reference: Tensor) -> Tensor:
    """Pearson correlation of each stage curve in curves [..., k] with reference [K] (K a multiple of k): [...].

    NaN where a curve (or the resampled reference) is constant: a flat curve has no stages to align.
    """
    target = block_means(reference.double(), curves.shape[-1])
    x = curves.double() - curves.double().mean(-1, keepdim=True)
    y = target - target.mean()
    denominator = x.norm(dim=-1) * y.norm()
    flat = denominator <= 1e-12 * max(1.0, float(curves.double().abs().max()))
    return torch.where(flat, torch.full_like(denominator, math.nan), (x * y).sum(-1) / denominator)


def stage_amplitude(curves: Tensor) -> Tensor:
    """max − min over the last dim of curves [..., k]: [...]."""
    return curves.amax(-1) - curves.amin(-1)


def sink_mass(probs: Tensor, valid: Tensor | None = None) -> Tensor:
    """The attention valid queries put on position 0, probs [..., B, H, T, T] → mean over queries [..., B, H]."""
    first = probs[..., 0].double()  # [..., B, H, T]: each query's weight on key 0
    if valid is None:
        return first.mean(-1)
    rows = valid.to(first.device, torch.double)[:, None, :]  # [B, 1, T]
    return (first * rows).sum(-1) / rows.sum(-1).clamp_min(1.0)


def top_activation(states: Tensor, valid: Tensor | None = None) -> Tensor:
    """max |x| over valid tokens and channels of states [..., B, T, d]: [...]."""
    magnitude = states.abs()
    if valid is not None:
        magnitude = magnitude * valid.to(states.device, states.dtype)[:, :, None]
    return magnitude.flatten(-3).amax(-1)


def distance_to_state(states: Tensor, target: Tensor, valid: Tensor | None = None) -> Tensor:
    """‖X − X*‖_F / ‖X*‖_F over valid tokens, each X* its own denominator.

    states [..., B, T, d] and target [..., B, T, d] (broadcast over the leading dims, e.g. states
    [loops, layers, B, T, d] against target [layers, B, T, d]) → [...].
    """
    diff, target = (states.double() - target.double()), target.double()
    if valid is not None:
        weight = valid.to(states.device, torch.double)[:, :, None]
        diff, target = diff * weight, target * weight
    return diff.flatten(-3).norm(dim=-1) / target.flatten(-3).norm(dim=-1).clamp_min(1e-30)
