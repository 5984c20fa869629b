"""Massive activations and the MLP-zeroing ablation (docs/methods.md §7).

Massive-activation ratio of a state X (over valid tokens and all channels):

    R = max |X_{i,c}| / median |X_{i,c}|

A few channels of a few tokens (often the attention-sink token) grow orders of
magnitude above the rest; R per (loop, layer) shows where they appear. The
ablation zeroes one layer's MLP output (in every loop, for a core layer) with a
forward hook on ``layer.mlp`` that returns zeros, and re-measures ColSum
concentration: if the sink stages vanish, that MLP writes the massive
activations that create them. MLPs are named by where they sit: ``preludeI``,
``coreI``, ``middleI`` (a retrofit's kept middle) and ``codaI``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from looplab.analysis.colsum import colsum_trace
from looplab.errors import choice_error
from looplab.model.protocol import LoopedModel
from looplab.model.trace import trace

__all__ = ["massive_ratio", "massive_activations", "mlp_modules", "zero_mlp", "mlp_output_max", "colsum_mlp_ablation"]

SITES = ("prelude", "core", "middle", "coda")


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


def mlp_modules(model: LoopedModel) -> dict[str, nn.Module]:
    """Every MLP of a looped model (looplab's or a retrofit) by name, in depth order: ``prelude0`` … ``coda{c−1}``."""
    return {
        f"{site}{index}": layer.mlp
        for site in SITES
        for index, layer in enumerate(getattr(model, site, ()))
        if hasattr(layer, "mlp")
    }


@contextmanager
def zero_mlp(model: LoopedModel, layer: int | str) -> Iterator[nn.Module]:
    """Within the block, MLP ``layer`` (a name as :func:`mlp_modules` gives, or a core index) outputs zeros.

    A name that is not one of the model's MLPs is a one-line error naming the valid ones.
    """
    mlps = mlp_modules(model)
    name = f"core{layer}" if isinstance(layer, int) else layer
    if name not in mlps:
        raise choice_error("MLP to zero", name, mlps)
    handle = mlps[name].register_forward_hook(lambda _module, _args, output: torch.zeros_like(output))
    try:
        yield mlps[name]
    finally:
        handle.remove()


@torch.no_grad()
def mlp_output_max(model: LoopedModel, run, valid: Tensor) -> dict[str, float]:
    """max |output| over valid tokens, channels and calls of every MLP, while ``run()`` runs the model.

    ``valid`` [B, T] is the batch's token mask; a core MLP is read over all its loops.
    """
    largest = dict.fromkeys(mlp_modules(model), 0.0)
    mask = valid.bool()

    def watch(name):
        def hook(_module, _args, output):
            largest[name] = max(largest[name], float(output.detach()[mask.to(output.device)].abs().max()))

        return hook

    handles = [mlp.register_forward_hook(watch(name)) for name, mlp in mlp_modules(model).items()]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return largest


@torch.no_grad()
def colsum_mlp_ablation(
    model: LoopedModel, tokens: Tensor, valid: Tensor, loops: int, layer: int | str
) -> tuple[Tensor, Tensor]:
    """ColSum concentration [loops, layers, H] without and with MLP ``layer`` (as for :func:`zero_mlp`) zeroed."""
    base = colsum_trace(trace(model, tokens, valid, loops, attention=True))
    with zero_mlp(model, layer):
        ablated = colsum_trace(trace(model, tokens, valid, loops, attention=True))
    return base, ablated
