"""A schedule plugin: supervise at factor × T(n), capped, and read at the same depth.

It declares two keys of its own, ``[schedule] factor`` and ``cap``, with their
defaults and domains; nothing else in looplab needs to know them.
"""

from dataclasses import dataclass

from looplab.params import at_least, param
from looplab.schedules import DepthRule, register_schedule


@register_schedule
class Scaled(DepthRule):
    name = "scaled"
    label = "{factor} × T(n) (≤ {cap})"

    @dataclass
    class Params:
        factor: int = param(2, at_least(1), "the multiple of T(n) trained and read at")
        cap: int = param(40, at_least(1), "the deepest depth trained and read at")

    @classmethod
    def training_depth(cls, params, deepest):
        return min(params.factor * deepest, params.cap)

    @classmethod
    def test_depth_bound(cls, params):
        return params.cap

    def train_depths(self, lengths, generator):
        return (self.params.factor * self.task.steps(lengths)).clamp(1, self.params.cap)

    def policy_depth(self, lengths):
        return self.train_depths(lengths, None)
