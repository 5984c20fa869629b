"""Attention reuse after convergence: the mechanistic paper's latency hint, measured (docs/methods.md §7).

Attention heads of a looped model settle after a few loops, so a later loop could
reuse a head's last pattern instead of computing QKᵀ and its softmax again. With a
threshold ε, a (sample, head) of a core layer whose pattern changed by less than ε
between consecutive loops,

    change_t = mean over valid queries i of ½ Σ_j |A_{t,ij} − A_{t−1,ij}|   (total variation, in [0, 1]),

keeps that pattern for every later loop of the unroll. The values V are still
computed each loop; only the pattern is reused.

:class:`AttentionReuse` does this on a looplab model through forward hooks on each core
layer's ``attn.weights`` (the site its probabilities pass through), which replace a
frozen head's fresh probabilities with the stored ones. The probabilities are still
computed underneath, so the hook measures what reuse does to the outputs, and counts
the patterns a kernel that skipped them would save; it does not time them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.model.looped import LoopedTransformer

__all__ = ["AttentionReuse", "pattern_change"]


def pattern_change(new: Tensor, old: Tensor, valid: Tensor | None = None) -> Tensor:
    """Mean total-variation distance over valid queries, probs [B, H, T, T] twice → [B, H]."""
    distance = 0.5 * (new.double() - old.double()).abs().sum(-1)  # [B, H, T]
    if valid is None:
        return distance.mean(-1)
    rows = valid.to(distance.device, torch.double)[:, None, :]
    return (distance * rows).sum(-1) / rows.sum(-1).clamp_min(1.0)


class _LayerReuse:
    """One core layer's stored pattern [B, H, T, T] and which (sample, head) reuse it [B, H]."""

    def __init__(self, valid: Tensor, epsilon: float):
        self.valid, self.epsilon = valid, epsilon
        self.last: Tensor | None = None
        self.frozen: Tensor | None = None
        self.reused = 0
        self.patterns = 0

    def __call__(self, _module, _args, probs: Tensor) -> Tensor:
        self.patterns += probs.shape[0] * probs.shape[1]
        if self.last is None:
            self.last, self.frozen = probs, torch.zeros(probs.shape[:2], dtype=torch.bool, device=probs.device)
            return probs
        self.reused += int(self.frozen.sum())
        used = torch.where(self.frozen[:, :, None, None], self.last, probs)
        # a head computed this loop freezes when it moved less than ε: it reuses from the next loop on
        self.frozen = self.frozen | (pattern_change(probs, self.last, self.valid) < self.epsilon)
        self.last = used
        return used


class AttentionReuse:
    """Within the block, every core layer's heads reuse their pattern once it changes by less than ``epsilon``.

    One instance serves one unroll of one batch (valid [B, T]); ``reused_share`` is the share of
    core (sample, head, layer, loop) patterns that were reused rather than computed.
    """

    def __init__(self, model: LoopedTransformer, valid: Tensor, epsilon: float):
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        self.model, self.layers = model, [_LayerReuse(valid, epsilon) for _ in model.core]
        self._handles = []

    def __enter__(self) -> AttentionReuse:
        self._handles = [
            layer.attn.weights.register_forward_hook(state) for layer, state in zip(self.model.core, self.layers)
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def reused_share(self) -> float:
        """Reused patterns over all core patterns so far (NaN before any loop ran)."""
        patterns = sum(layer.patterns for layer in self.layers)
        return sum(layer.reused for layer in self.layers) / patterns if patterns else float("nan")
