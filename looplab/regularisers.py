"""Penalties added to the training loss, and their registry (docs/methods.md §6).

The contract of an entry: subclass :class:`Regulariser`, give it a ``name``,
build it from the config in :meth:`Regulariser.from_config` (None when the
config leaves it off), compute :meth:`Regulariser.penalty` — per-sample
values [B] from the model, the probe states (each row's state at its
supervised depth, with gradient) and a generator — and decorate the class
with :func:`register_regulariser`.

What the framework does around every entry, the same for all (``train_step``):

- from step ``warmup + 1`` on, a generator derived from (seed, name, step)
  first decides, with probability ``prob``, whether this step is regularised;
  the same generator (forked per data-parallel rank) then goes to ``penalty``;
- the schedule is asked for the probe states only on steps that use them;
- loss = (1 − Σ w)·task loss + Σ w·mean(penalty) over the regularisers applied
  on this step, and each mean penalty is logged under its name.

Built in: ``jsrr``, the Jacobian spectral-radius regulariser of ``[stability.jsrr]``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from looplab.config import Config
from looplab.model import LoopedTransformer
from looplab.model.looped import LoopProbe
from looplab.parallel import Parallel
from looplab.seeding import derive_generator
from looplab.stability.jacobian import jsrr_per_sample

__all__ = [
    "REGULARISERS",
    "Regulariser",
    "JacobianPenalty",
    "register_regulariser",
    "build_regularisers",
    "regularised_loss",
]


@dataclass
class Regulariser(ABC):
    """A penalty with its weight w, warm-up (steps without it) and per-step probability."""

    name: ClassVar[str] = ""
    weight: float
    warmup: int = 0
    prob: float = 1.0

    @classmethod
    @abstractmethod
    def from_config(cls, config: Config) -> Regulariser | None:
        """The regulariser ``config`` asks for, or None when it is off."""

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
    """Class decorator: every run asks ``cls.from_config`` whether to apply it."""
    REGULARISERS[cls.name] = cls
    return cls


def build_regularisers(config: Config) -> list[Regulariser]:
    """The regularisers ``config`` turns on, in registration order."""
    return [found for cls in REGULARISERS.values() if (found := cls.from_config(config)) is not None]


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
@dataclass
class JacobianPenalty(Regulariser):
    """JSRR: the ``estimator`` of the one-loop Jacobian at the probe states (``stability.jacobian``),
    on ``rows`` rows drawn at random (0: every row)."""

    name: ClassVar[str] = "jsrr"
    estimator: str = "jvp"
    power_iters: int = 1
    rows: int = 0

    @classmethod
    def from_config(cls, config):
        jsrr = config.stability.jsrr
        if jsrr.estimator == "none":
            return None
        return cls(jsrr.weight, jsrr.warmup, jsrr.prob, jsrr.estimator, jsrr.power_iters, jsrr.rows)

    def penalty(self, model, probe, generator):
        if 0 < self.rows < len(probe.h):
            chosen = torch.randperm(len(probe.h), generator=generator)[: self.rows].to(probe.h.device)
            probe = LoopProbe(probe.h[chosen], probe.e[chosen], probe.valid[chosen])
        return jsrr_per_sample(model, probe, self.estimator, self.power_iters, generator)
