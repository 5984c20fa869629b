"""Penalties added to the training loss, and their registry (docs/methods.md §6).

The contract of an entry: subclass :class:`Regulariser`, give it a ``name``,
declare its ``[stability.NAME]`` keys as a ``Params`` dataclass that extends
:class:`Regulariser.Params` (``weight``, ``warmup``, ``prob``; fields made with
:func:`looplab.params.param`), compute :meth:`Regulariser.penalty` — per-sample
values [B] from the model, the probe states (each row's state at its
supervised depth, with gradient) and a generator — and decorate the class
with :func:`register_regulariser`. It is on when :meth:`Regulariser.active`
says so (by default: ``weight > 0``, and the default weight is 0, so a
registered entry changes nothing until a config turns it on).

What the framework does around every entry, the same for all (``train_step``):

- its table is checked against ``Params`` and completed with its defaults
  (``check_config``), so every run dir's config.toml shows every regulariser;
- from step ``warmup + 1`` on, a generator derived from (seed, name, step)
  first decides, with probability ``prob``, whether this step is regularised;
  the same generator (forked per data-parallel rank) then goes to ``penalty``;
- the schedule is asked for the probe states only on steps that use them;
- loss = (1 − Σ w)·task loss + Σ w·mean(penalty) over the regularisers applied
  on this step, and each mean penalty is logged under its name.

Built in: ``jsrr``, the Jacobian spectral-radius regulariser of ``[stability.jsrr]``, and
``state_l2``, an L2 penalty on the state (``[stability.state_l2]``, off until its weight is set).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from looplab.config import Config
from looplab.errors import choice_error
from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopProbe
from looplab.parallel import Parallel
from looplab.params import UNIT, as_dict, at_least, fill, one_of, param
from looplab.plugins import register_entry
from looplab.seeding import derive_generator
from looplab.stability.jacobian import ESTIMATORS as JSRR_ESTIMATORS
from looplab.stability.jacobian import jsrr_per_sample

__all__ = [
    "REGULARISERS",
    "Regulariser",
    "JacobianPenalty",
    "StateL2",
    "register_regulariser",
    "build_regularisers",
    "regulariser_params",
    "complete_stability",
    "regularised_loss",
]


class Regulariser(ABC):
    """A penalty with its weight w, warm-up (steps without it) and per-step probability."""

    name: ClassVar[str] = ""

    @dataclass
    class Params:
        weight: float = param(0.0, UNIT, "w in (1 − Σ w)·task loss + Σ w·penalty; 0: off")
        warmup: int = param(0, at_least(0), "steps without the penalty")
        prob: float = param(1.0, UNIT, "the probability that a step is regularised")

    def __init__(self, params: Any = None, **values: Any):
        """From a ``Params`` instance, or from keyword values (``JacobianPenalty(weight=0.1)``), checked."""
        self.params = params if params is not None else fill(self.Params, values, f"stability.{self.name}")

    @classmethod
    def active(cls, params: Any) -> bool:
        """Whether a run with these parameters applies the penalty."""
        return params.weight > 0

    @property
    def weight(self) -> float:
        return self.params.weight

    @property
    def warmup(self) -> int:
        return self.params.warmup

    @property
    def prob(self) -> float:
        return self.params.prob

    @abstractmethod
    def penalty(self, model: LoopedTransformer, probe: LoopProbe, generator: torch.Generator) -> Tensor:
        """[B] per-sample penalty at the probe states (or at a subset of them), differentiable in the
        model's parameters; the loss takes its mean."""

    def generator_for(self, step: int, seed: int, parallel: Parallel) -> torch.Generator | None:
        """The generator of this step's penalty, or None when the step is not regularised."""
        if step <= self.warmup:
            return None
        generator = derive_generator(seed, self.name, step)
        if float(torch.rand((), generator=generator)) >= self.prob:
            return None
        return parallel.fork(generator)


REGULARISERS: dict[str, type[Regulariser]] = {}


def register_regulariser(cls: type[Regulariser]) -> type[Regulariser]:
    """Class decorator: every run reads ``[stability.NAME]`` into ``cls.Params`` and applies it when active."""
    register_entry(REGULARISERS, cls.name, cls, "regulariser")
    return cls


def _regulariser_class(name: str) -> type[Regulariser]:
    if name not in REGULARISERS:
        raise choice_error("regulariser [stability.NAME], NAME =", name, REGULARISERS)
    return REGULARISERS[name]


def regulariser_params(name: str, table: dict[str, Any]) -> Any:
    """The checked ``Params`` of the regulariser ``name`` from its ``[stability.NAME]`` table."""
    return fill(_regulariser_class(name).Params, table, f"stability.{name}")


def complete_stability(stability: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every registered regulariser's table, checked and completed with its defaults, in registration order."""
    for name in stability:
        _regulariser_class(name)  # an unknown table is an error, even where defaults fill the rest
    return {name: as_dict(regulariser_params(name, stability.get(name, {}))) for name in REGULARISERS}


def build_regularisers(config: Config) -> list[Regulariser]:
    """The regularisers ``config`` turns on, in registration order."""
    found = []
    for name, cls in REGULARISERS.items():
        params = regulariser_params(name, config.stability.get(name, {}))
        if cls.active(params):
            found.append(cls(params))
    return found


def regularised_loss(
    loss: Tensor,
    stats: dict[str, float],
    model: LoopedTransformer,
    probe: LoopProbe | None,
    active: list[tuple[Regulariser, torch.Generator]],
) -> tuple[Tensor, dict[str, float]]:
    """(1 − Σ w)·loss + Σ w·mean(penalty) over ``active`` (each regulariser with its generator), and the
    stats with each mean penalty added."""
    if not active:
        return loss, stats
    penalties = [(reg, reg.penalty(model, probe, generator).mean()) for reg, generator in active]
    total_weight = sum(reg.weight for reg, _ in penalties)
    loss = (1 - total_weight) * loss + sum(reg.weight * value for reg, value in penalties)
    return loss, {**stats, **{reg.name: float(value.detach()) for reg, value in penalties}}


@register_regulariser
class JacobianPenalty(Regulariser):
    """JSRR: the ``estimator`` of the one-loop Jacobian at the probe states (``stability.jacobian``),
    on ``rows`` rows drawn at random (0: every row); on unless ``estimator = "none"``."""

    name: ClassVar[str] = "jsrr"

    @dataclass
    class Params(Regulariser.Params):
        weight: float = param(0.1, UNIT, "w in (1 − w)·CE + w·penalty")
        estimator: str = param("none", one_of(*JSRR_ESTIMATORS), "none: off")
        power_iters: int = param(1, at_least(0), "gradient-free power iterations before the penalty")
        rows: int = param(0, at_least(0), "rows of the batch the penalty is computed on; 0: every row")

    @classmethod
    def active(cls, params):
        return params.estimator != "none"

    def penalty(self, model, probe, generator):
        rows = self.params.rows
        if 0 < rows < len(probe.h):
            chosen = torch.randperm(len(probe.h), generator=generator)[:rows].to(probe.h.device)
            ctx = None if probe.ctx is None else probe.ctx.select(chosen)
            probe = LoopProbe(probe.h[chosen], probe.e[chosen], probe.valid[chosen], ctx)
        return jsrr_per_sample(model, probe, self.params.estimator, self.params.power_iters, generator)


@register_regulariser
class StateL2(Regulariser):
    """An L2 penalty on the recurrent state: per row, the mean over its valid positions of ‖h‖² / d at
    the probe depth (a remedy STARS argues fails; docs/methods.md §6)."""

    name: ClassVar[str] = "state_l2"

    def penalty(self, model, probe, generator):
        squares = probe.h.pow(2).mean(dim=-1)  # [B, L]: ‖h‖² / d per position
        valid = probe.valid.to(squares.dtype)
        return (squares * valid).sum(1) / valid.sum(1).clamp(min=1)
