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
from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.params import ANY_REAL, NON_NEGATIVE, at_least, param
from looplab.schedules.base import ConstantDepth, DepthRule, DepthWindow, register_schedule


@register_schedule
class Fixed(DepthRule):
    name = "fixed"
    label = "fixed K = {depth}"
    Params = ConstantDepth

    @classmethod
    def test_depth_bound(cls, params):
        return params.depth

    @classmethod
    def training_depth(cls, params, deepest):
        return params.depth

    def train_depths(self, lengths, generator):
        return torch.full_like(lengths, self.params.depth)

    def policy_depth(self, lengths):
        return torch.full_like(lengths, self.params.depth)


@register_schedule
class Matched(DepthRule):
    name = "matched"
    label = "matched T(n)"

    @classmethod
    def training_depth(cls, params, deepest):
        return deepest

    def train_depths(self, lengths, generator):
        return self.task.steps(lengths)

    def policy_depth(self, lengths):
        return self.task.steps(lengths)


@register_schedule
class Window(Matched):
    name = "window"
    label = "T(n) ± {window} (≤ {t_max})"
    Params = DepthWindow

    @classmethod
    def training_depth(cls, params, deepest):
        return min(deepest + params.window, params.t_max)

    @classmethod
    def check_task(cls, params, deepest):
        if params.t_max < deepest:
            raise LooplabError(
                f"the {cls.name} schedule clips training depths at schedule.t_max = {params.t_max}, below "
                f"T(train_max) = {deepest}: the longest training instances would never get their depth; "
                f"set t_max >= {deepest}"
            )

    def train_depths(self, lengths, generator):
        offsets = self._offsets(self.params.window, len(lengths), generator)
        return (self.task.steps(lengths) + offsets).clamp(1, self.params.t_max)


@register_schedule
class FixedWindow(Fixed):
    name = "fixed_window"
    label = "K = {depth} ± {window} (≤ {t_max})"

    @dataclass
    class Params(ConstantDepth, DepthWindow):
        pass

    @classmethod
    def training_depth(cls, params, deepest):
        return min(params.depth + params.window, params.t_max)

    @classmethod
    def check(cls, params):
        if params.t_max < params.depth:
            raise LooplabError(
                f"the fixed_window schedule trains around schedule.depth = {params.depth} clipped to "
                f"schedule.t_max = {params.t_max}: it never trains at its own depth; set t_max >= {params.depth}"
            )

    def train_depths(self, lengths, generator):
        offsets = self._offsets(self.params.window, len(lengths), generator)
        return (self.params.depth + offsets).clamp(1, self.params.t_max)


@register_schedule
class MultiDepth(Matched):
    """Deterministic average over the whole window (the ablation of paper 1)."""

    name = "multi_depth"
    label = "all of T(n) ± {window}"
    Params = DepthWindow
    several_depths = True
    # Window's rules, bound to this class (Window.check_task would be bound to Window, and name it)
    check_task = classmethod(Window.check_task.__func__)
    training_depth = classmethod(Window.training_depth.__func__)

    def train_depths(self, lengths, generator):
        w = self.params.window
        window = self.task.steps(lengths)[:, None] + torch.arange(-w, w + 1)[None, :]
        inside = (window >= 1) & (window <= self.params.t_max)
        depths = torch.where(inside, window, torch.zeros_like(window))
        # A window entirely above t_max still trains at t_max rather than nowhere.
        empty = ~inside.any(dim=1)
        depths[empty, 0] = self.params.t_max
        return depths


class RandomLoops(DepthRule):
    """Random loop counts independent of the instance (STARS); read at ``depth`` at test time.

    One depth for the whole batch when ``per_batch`` (as the STARS code), else one per row.
    """

    def train_depths(self, lengths, generator):
        if self.params.per_batch:  # one draw for every row (and every rank)
            depths = self.draw(1, generator).expand(len(lengths)).clone()
        else:
            depths = self.parallel.draw_rows(lambda n: self.draw(n, generator), len(lengths))
        return depths.clamp(self.params.lo, self.params.hi)

    @abstractmethod
    def draw(self, count: int, generator: torch.Generator) -> Tensor:
        """[count] long depths before clipping."""

    def policy_depth(self, lengths):
        return torch.full_like(lengths, self.params.depth)

    @classmethod
    def test_depth_bound(cls, params):
        return params.depth

    @classmethod
    def training_depth(cls, params, deepest):
        return params.hi

    @classmethod
    def check(cls, params):
        if params.lo > params.hi:
            raise LooplabError(
                f"the {cls.name} schedule needs schedule.lo <= schedule.hi, got {params.lo} > {params.hi}"
            )


@dataclass
class LoopRange(ConstantDepth):
    """The clip range [lo, hi] of a random loop count, its spread σ, and one draw per batch or per row."""

    sigma: float = param(0.7, NON_NEGATIVE, "the log-normal's σ")
    lo: int = param(1, at_least(1))
    hi: int = param(100, at_least(1))
    per_batch: bool = param(True, None, "one depth for the whole batch (as STARS) or one per row")


@register_schedule
class LogNormal(RandomLoops):
    """τ = clip(round(exp(N(μ, σ))), lo, hi)."""

    name = "lognormal"
    label = "log-normal loops, read at {depth}"

    @dataclass
    class Params(LoopRange):
        mu: float = param(2.0, ANY_REAL, "the log-normal's μ")

    def draw(self, count, generator):
        normal = torch.randn(count, generator=generator, dtype=torch.float64)
        return torch.round(torch.exp(self.params.mu + self.params.sigma * normal)).long()


@register_schedule
class PoissonLogNormal(RandomLoops):
    """τ = 1 + Poisson(λ), λ = exp(N(log(r̄ − 1) − σ²/2, σ)), clipped to [lo, hi].

    E[λ] = r̄ − 1, so E[τ] = r̄ exactly before clipping, while τ ≥ 1 always.
    """

    name = "poisson_lognormal"
    label = "Poisson-log-normal loops, read at {depth}"

    @dataclass
    class Params(LoopRange):
        mean_depth: float = param(8.0, at_least(1), "r̄, the mean loop count before clipping")

    def draw(self, count, generator):
        sigma, excess = self.params.sigma, self.params.mean_depth - 1
        if excess <= 0:
            return torch.ones(count, dtype=torch.long)
        normal = torch.randn(count, generator=generator, dtype=torch.float64)
        rate = torch.exp(math.log(excess) - sigma**2 / 2 + sigma * normal)
        return 1 + torch.poisson(rate, generator=generator).long()
