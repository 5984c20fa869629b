"""Training-depth schedules (SPEC §3) and their test-time policy depths.

A schedule gives every training row its supervision depth τ, and says at which
depth a trained model should be read at test time. To add one, subclass
:class:`Schedule` and decorate it with ``@register_schedule``.

| name           | τ during training                         | policy depth |
|----------------|-------------------------------------------|--------------|
| fixed          | c                                         | c            |
| matched        | T(n)                                      | T(n)         |
| window         | clip(T(n) + Δ, 1, t_max), Δ ~ U{-w..w}     | T(n)         |
| fixed_window   | clip(c + Δ, 1, t_max)                      | c            |
| multi_depth    | every k in T(n)-w..T(n)+w within [1, t_max] (loss averaged) | T(n) |
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from looplab.config import ScheduleConfig
from looplab.errors import choice_error
from looplab.tasks import Task


class Schedule(ABC):
    """Maps instance sizes to training depths and test-time policy depths."""

    name: str = ""

    def __init__(self, cfg: ScheduleConfig, task: Task):
        self.cfg = cfg
        self.task = task

    @abstractmethod
    def train_depths(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        """Depths for a batch of sizes ``lengths`` [B].

        Returns [B] long (one supervised depth per row) or [B, J] long (several;
        entries <= 0 are unused), ready for ``LoopedTransformer.forward_at_depths``.
        """

    @abstractmethod
    def policy_depth(self, lengths: Tensor) -> Tensor:
        """[B] long: the depth at which each row is read at test time."""

    def _offsets(self, count: int, generator: torch.Generator) -> Tensor:
        """Δ ~ U{-w..w}, [count] long."""
        w = self.cfg.window
        return torch.randint(-w, w + 1, (count,), generator=generator)


SCHEDULES: dict[str, type[Schedule]] = {}


def register_schedule(cls: type[Schedule]) -> type[Schedule]:
    SCHEDULES[cls.name] = cls
    return cls


def make_schedule(cfg: ScheduleConfig, task: Task) -> Schedule:
    if cfg.name not in SCHEDULES:
        raise choice_error("schedule", cfg.name, SCHEDULES)
    return SCHEDULES[cfg.name](cfg, task)


@register_schedule
class Fixed(Schedule):
    name = "fixed"

    def train_depths(self, lengths, generator):
        return torch.full_like(lengths, self.cfg.depth)

    def policy_depth(self, lengths):
        return torch.full_like(lengths, self.cfg.depth)


@register_schedule
class Matched(Schedule):
    name = "matched"

    def train_depths(self, lengths, generator):
        return self.task.steps(lengths)

    def policy_depth(self, lengths):
        return self.task.steps(lengths)


@register_schedule
class Window(Matched):
    name = "window"

    def train_depths(self, lengths, generator):
        return (self.task.steps(lengths) + self._offsets(len(lengths), generator)).clamp(1, self.cfg.t_max)


@register_schedule
class FixedWindow(Fixed):
    name = "fixed_window"

    def train_depths(self, lengths, generator):
        return (self.cfg.depth + self._offsets(len(lengths), generator)).clamp(1, self.cfg.t_max)


@register_schedule
class MultiDepth(Matched):
    """Deterministic average over the whole window (the ablation of paper 1)."""

    name = "multi_depth"

    def train_depths(self, lengths, generator):
        w = self.cfg.window
        window = self.task.steps(lengths)[:, None] + torch.arange(-w, w + 1)[None, :]
        inside = (window >= 1) & (window <= self.cfg.t_max)
        depths = torch.where(inside, window, torch.zeros_like(window))
        # A window entirely above t_max still trains at t_max rather than nowhere.
        empty = ~inside.any(dim=1)
        depths[empty, 0] = self.cfg.t_max
        return depths
