"""The rule schedules (docs/methods.md §3): depths from the instance size, or drawn independently of it.

| name           | τ during training                         | policy depth |
|----------------|-------------------------------------------|--------------|
| fixed          | c                                         | c            |
| matched        | T(n)                                      | T(n)         |
| window         | clip(T(n) + Δ, 1, t_max), Δ ~ U{-w..w}     | T(n)         |
| fixed_window   | clip(c + Δ, 1, t_max)                      | c            |
| multi_depth    | every k in T(n)-w..T(n)+w within [1, t_max] (loss averaged) | T(n) |
| lognormal      | clip(round(exp(N(μ, σ))), lo, hi), per batch or per row | depth |
| poisson_lognormal | 1 + Poisson(exp(N(log(r̄−1) − σ²/2, σ))), clipped; mean r̄ | depth |
"""

from __future__ import annotations

import math
from abc import abstractmethod

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.schedules.base import DepthRule, register_schedule


@register_schedule
class Fixed(DepthRule):
    name = "fixed"
    params = ("depth",)

    @classmethod
    def test_depth_bound(cls, cfg):
        return cfg.depth

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
    params = ("window", "t_max")

    @classmethod
    def check_task(cls, cfg, deepest):
        if cfg.t_max < deepest:
            raise LooplabError(
                f"the {cls.name} schedule clips training depths at schedule.t_max = {cfg.t_max}, below "
                f"T(train_max) = {deepest}: the longest training instances would never get their depth; "
                f"set t_max >= {deepest}"
            )

    def train_depths(self, lengths, generator):
        return (self.task.steps(lengths) + self._offsets(len(lengths), generator)).clamp(1, self.cfg.t_max)


@register_schedule
class FixedWindow(Fixed):
    name = "fixed_window"
    params = ("depth", "window", "t_max")

    @classmethod
    def check(cls, cfg):
        if cfg.t_max < cfg.depth:
            raise LooplabError(
                f"the fixed_window schedule trains around schedule.depth = {cfg.depth} clipped to "
                f"schedule.t_max = {cfg.t_max}: it never trains at its own depth; set t_max >= {cfg.depth}"
            )

    def train_depths(self, lengths, generator):
        return (self.cfg.depth + self._offsets(len(lengths), generator)).clamp(1, self.cfg.t_max)


@register_schedule
class MultiDepth(Matched):
    """Deterministic average over the whole window (the ablation of paper 1)."""

    name = "multi_depth"
    params = ("window", "t_max")
    check_task = Window.check_task

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

    @classmethod
    def test_depth_bound(cls, cfg):
        return cfg.depth

    @classmethod
    def check(cls, cfg):
        if cfg.lo > cfg.hi:
            raise LooplabError(f"the {cls.name} schedule needs schedule.lo <= schedule.hi, got {cfg.lo} > {cfg.hi}")


@register_schedule
class LogNormal(RandomLoops):
    """τ = clip(round(exp(N(μ, σ))), lo, hi)."""

    name = "lognormal"
    params = ("mu", "sigma", "lo", "hi", "per_batch", "depth")

    def draw(self, count, generator):
        normal = torch.randn(count, generator=generator, dtype=torch.float64)
        return torch.round(torch.exp(self.cfg.mu + self.cfg.sigma * normal)).long()


@register_schedule
class PoissonLogNormal(RandomLoops):
    """τ = 1 + Poisson(λ), λ = exp(N(log(r̄ − 1) − σ²/2, σ)), clipped to [lo, hi].

    E[λ] = r̄ − 1, so E[τ] = r̄ exactly before clipping, while τ ≥ 1 always.
    """

    name = "poisson_lognormal"
    params = ("mean_depth", "sigma", "lo", "hi", "per_batch", "depth")

    def draw(self, count, generator):
        sigma, excess = self.cfg.sigma, self.cfg.mean_depth - 1
        if excess <= 0:
            return torch.ones(count, dtype=torch.long)
        normal = torch.randn(count, generator=generator, dtype=torch.float64)
        rate = torch.exp(math.log(excess) - sigma**2 / 2 + sigma * normal)
        return 1 + torch.poisson(rate, generator=generator).long()
