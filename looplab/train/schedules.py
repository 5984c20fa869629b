"""Training-depth schedules (docs/methods.md §3) and their test-time policy depths.

A schedule gives every training row its supervision depth τ, and says at which
depth a trained model should be read at test time. To add one, subclass
:class:`Schedule` and decorate it with ``@register_schedule``: a fixed rule
subclasses :class:`DepthRule` and implements ``train_depths`` and
``policy_depth``; a learned one (``looplab/train/halting.py``) owns a
``module`` and implements ``training_loss`` and ``test_depths``.

| name           | τ during training                         | policy depth |
|----------------|-------------------------------------------|--------------|
| fixed          | c                                         | c            |
| matched        | T(n)                                      | T(n)         |
| window         | clip(T(n) + Δ, 1, t_max), Δ ~ U{-w..w}     | T(n)         |
| fixed_window   | clip(c + Δ, 1, t_max)                      | c            |
| multi_depth    | every k in T(n)-w..T(n)+w within [1, t_max] (loss averaged) | T(n) |
| lognormal      | clip(round(exp(N(μ, σ))), lo, hi), per batch or per row | depth |
| poisson_lognormal | 1 + Poisson(exp(N(log(r̄−1) − σ²/2, σ))), clipped; mean r̄ | depth |
| rl_halting, pondernet | learned (``halting.py``)              | argmax π     |
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from looplab.config import ScheduleConfig
from looplab.errors import choice_error
from looplab.model import LoopedTransformer
from looplab.model.looped import LoopProbe
from looplab.tasks import Task, TaskBatch
from looplab.train.distributed import SINGLE, Parallel
from looplab.train.objectives import depth_supervised_loss


@dataclass
class StepOutput:
    """What a schedule's training loss hands the trainer.

    Attributes:
        loss: scalar to minimise.
        stats: scalar statistics to log (``block_evals`` and ``row_loops_mean`` at least).
        probe: states at each row's supervised depth, for a one-loop regulariser (when asked).
    """

    loss: Tensor
    stats: dict[str, float]
    probe: LoopProbe | None = None


def depth_stats(depths: Tensor) -> dict[str, float]:
    """Cost of a step with per-row depths [B] or [B, J].

    ``block_evals``: core applications of a batch-parallel unroll (max τ);
    ``row_loops_mean``: mean τ, what active-set compaction actually pays per row.
    """
    per_row = depths.view(depths.shape[0], -1).max(dim=1).values.float()
    return {"block_evals": float(per_row.max()), "row_loops_mean": float(per_row.mean())}


class Schedule(ABC):
    """A training objective over depth plus a test-time depth rule."""

    name: str = ""
    #: learned parameters (e.g. a halting head), trained and checkpointed with the model
    module: nn.Module | None = None

    def __init__(self, cfg: ScheduleConfig, task: Task, d_model: int):
        self.cfg = cfg
        self.task = task

    #: truncated backprop: gradients through each row's last k loops only (0 = all; rule schedules)
    backprop_loops: int = 0
    #: data-parallel training: the batch is this rank's shard of the global batch
    parallel: Parallel = SINGLE

    @abstractmethod
    def training_loss(self, model: LoopedTransformer, batch: TaskBatch, generator: torch.Generator,
                      probe: bool = False) -> StepOutput:
        """The loss of one training batch, its statistics, and (if ``probe``) the probe states."""

    @abstractmethod
    def test_depths(self, lengths: Tensor, hazard_logits: Tensor | None) -> Tensor:
        """[N] long test-time depths; learned schedules read ``hazard_logits`` [N, T]."""

    def state_dict(self) -> dict:
        """JSON-able state besides ``module`` (e.g. a reward baseline)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class DepthRule(Schedule):
    """A schedule given by a rule: depths from the instance sizes alone.

    Under data parallelism each row's depth is drawn as for the global batch
    (:meth:`Parallel.draw_rows`), so a rank trains its rows at the depths
    single-process training would use.
    """

    @abstractmethod
    def train_depths(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        """Depths for a batch of sizes ``lengths`` [B].

        Returns [B] long (one supervised depth per row) or [B, J] long (several;
        entries <= 0 are unused), ready for ``LoopedTransformer.forward_at_depths``.
        """

    @abstractmethod
    def policy_depth(self, lengths: Tensor) -> Tensor:
        """[B] long: the depth at which each row is read at test time."""

    def training_loss(self, model, batch, generator, probe=False):
        depths = self.train_depths(batch.lengths, generator)
        out = model.forward_at_depths(batch.tokens, batch.valid, depths, self.parallel.fork(generator),
                                      backprop_loops=self.backprop_loops, return_probe=probe)
        logits, found = out if probe else (out, None)
        loss = depth_supervised_loss(logits, batch.labels, depths.to(logits.device))
        return StepOutput(loss, depth_stats(depths), found)

    def test_depths(self, lengths, hazard_logits):
        return self.policy_depth(lengths)

    def _offsets(self, count: int, generator: torch.Generator) -> Tensor:
        """Δ ~ U{-w..w}, [count] long."""
        w = self.cfg.window
        return self.parallel.draw_rows(lambda n: torch.randint(-w, w + 1, (n,), generator=generator), count)


SCHEDULES: dict[str, type[Schedule]] = {}


def register_schedule(cls: type[Schedule]) -> type[Schedule]:
    SCHEDULES[cls.name] = cls
    return cls


def make_schedule(cfg: ScheduleConfig, task: Task, d_model: int) -> Schedule:
    if cfg.name not in SCHEDULES:
        raise choice_error("schedule", cfg.name, SCHEDULES)
    return SCHEDULES[cfg.name](cfg, task, d_model)


@register_schedule
class Fixed(DepthRule):
    name = "fixed"

    def train_depths(self, lengths, generator):
        return torch.full_like(lengths, self.cfg.depth)

    def policy_depth(self, lengths):
        return torch.full_like(lengths, self.cfg.depth)


@register_schedule
class Matched(DepthRule):
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


class RandomLoops(DepthRule):
    """Random loop counts independent of the instance (STARS); read at ``depth`` at test time.

    One depth for the whole batch when ``per_batch`` (as the STARS code), else one per row.
    """

    def train_depths(self, lengths, generator):
        if self.cfg.per_batch:  # one draw for every row (and every rank)
            depths = self.draw(1, generator).expand(len(lengths)).clone()
        else:
            depths = self.parallel.draw_rows(lambda n: self.draw(n, generator), len(lengths))
        return depths.clamp(self.cfg.lo, self.cfg.hi)

    @abstractmethod
    def draw(self, count: int, generator: torch.Generator) -> Tensor:
        """[count] long depths before clipping."""

    def policy_depth(self, lengths):
        return torch.full_like(lengths, self.cfg.depth)


@register_schedule
class LogNormal(RandomLoops):
    """τ = clip(round(exp(N(μ, σ))), lo, hi)."""

    name = "lognormal"

    def draw(self, count, generator):
        normal = torch.randn(count, generator=generator, dtype=torch.float64)
        return torch.round(torch.exp(self.cfg.mu + self.cfg.sigma * normal)).long()


@register_schedule
class PoissonLogNormal(RandomLoops):
    """τ = 1 + Poisson(λ), λ = exp(N(log(r̄ − 1) − σ²/2, σ)), clipped to [lo, hi].

    E[λ] = r̄ − 1, so E[τ] = r̄ exactly before clipping, while τ ≥ 1 always.
    """

    name = "poisson_lognormal"

    def draw(self, count, generator):
        sigma, excess = self.cfg.sigma, self.cfg.mean_depth - 1
        if excess <= 0:
            return torch.ones(count, dtype=torch.long)
        normal = torch.randn(count, generator=generator, dtype=torch.float64)
        rate = torch.exp(math.log(excess) - sigma ** 2 / 2 + sigma * normal)
        return 1 + torch.poisson(rate, generator=generator).long()
