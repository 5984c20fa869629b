"""One gradient step, shared by every training loop: looplab's trainer and the fine-tune of a wrapped model."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn


def apply_gradients(
    loss: Tensor,
    optimizer: torch.optim.Optimizer,
    groups: dict[str, Iterable[nn.Parameter]],
    clip: float,
    before_clip: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Backpropagate ``loss``, clip each group's gradients to norm ``clip`` (0: no clipping) and step.

    Each group is clipped on its own, so one module's gradients (a halting head's) never
    rescale another's. ``before_clip`` runs between backward and clipping (where data-parallel
    training averages the gradients over ranks).

    Returns:
        each group's gradient norm before clipping (empty without clipping). When a norm is not
        finite the gradients are dropped and no parameter changes: the step was applied exactly
        when every returned norm is finite.
    """
    groups = {name: list(params) for name, params in groups.items()}
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if before_clip is not None:
        before_clip()
    norms = (
        {name: float(torch.nn.utils.clip_grad_norm_(params, clip)) for name, params in groups.items()} if clip else {}
    )
    if not all(math.isfinite(norm) for norm in norms.values()):  # a finite loss can still have a NaN gradient
        optimizer.zero_grad(set_to_none=True)
        return norms
    optimizer.step()
    return norms
