"""One optimisation step, shared by every training loop: looplab's trainer and the fine-tune of a wrapped model.

A step starts from what a training objective returns (:class:`looplab.schedules.base.StepOutput`:
the task loss, its statistics, the states a one-loop regulariser looks at), adds the active
regularisers ((1 − Σ w)·loss + Σ w·penalty), checks that the loss is finite on every rank,
and takes the gradient step: backward, per-group clipping, a non-finite gradient dropped, AdamW.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from looplab.parallel import SINGLE, Parallel
from looplab.regularisers import Regulariser, regularised_loss
from looplab.schedules.base import StepOutput


@dataclass
class AppliedStep:
    """What :func:`optimisation_step` did.

    Attributes:
        loss: the regularised loss, the mean over ranks (may be non-finite).
        stats: the objective's statistics with each applied regulariser's mean penalty.
        grad_norms: each parameter group's gradient norm before clipping; None when the loss was not
            finite and nothing was backpropagated. The step changed the parameters exactly when
            this is not None and every norm is finite.
    """

    loss: float
    stats: dict[str, float]
    grad_norms: dict[str, float] | None

    @property
    def applied(self) -> bool:
        return self.grad_norms is not None and all(math.isfinite(n) for n in self.grad_norms.values())


def optimisation_step(
    out: StepOutput,
    model: nn.Module,
    regularisers: Sequence[tuple[Regulariser, torch.Generator]],
    optimizer: torch.optim.Optimizer,
    groups: dict[str, Iterable[nn.Parameter]],
    clip: float,
    parallel: Parallel = SINGLE,
    before_clip: Callable[[], None] | None = None,
) -> AppliedStep:
    """The regularised loss of ``out``, then (when it is finite on every rank) :func:`apply_gradients`."""
    loss, stats = regularised_loss(out.loss, out.stats, model, out.probe, list(regularisers))
    global_loss = parallel.mean(loss.detach())  # every rank agrees whether to step
    if not math.isfinite(global_loss):
        return AppliedStep(global_loss, stats, None)
    return AppliedStep(global_loss, stats, apply_gradients(loss, optimizer, groups, clip, before_clip))


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
