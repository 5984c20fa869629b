"""Dyck-1 prefix classification: is each prefix of a bracket string valid?

An instance of size n is n brackets "(" / ")". The sequence is the brackets
alone (n positions) and every position is in the answer region: position i must
classify the prefix x_1..x_i as ``<invalid>`` (some prefix closed more than it
opened; once invalid, always invalid), ``<open>`` (valid, depth > 0) or
``<balanced>`` (valid, depth 0).

Why this sampler: uniform brackets drift away from depth 0 and go invalid
within a few steps, so ``<balanced>`` would vanish as n grows. Instead each row
is a random walk on a walker level >= 0 that always opens at level 0 and, above
it, closes with a per-row probability in [0.55, 0.8), so it hovers near 0 and
returns there often. Half of the rows are also given a random step t in [0, n):
at their first visit to level 0 from t on they close instead, which makes the
prefix invalid at a varied point. After that the walk goes on from level 0, so
the invalid suffix still looks locally balanced and the model has to remember
that the row broke, not just look at the recent depth.

T(n) = n: a sequential checker updates its depth and validity once per bracket.
"""

import torch
from torch import Tensor

from looplab.tasks.base import Task, register_task

# Fraction of rows that break once, and the range of the per-row probability
# of closing above level 0 (> 0.5 so the walk drifts back to 0).
BREAK_FRACTION = 0.5
CLOSE_LOW, CLOSE_HIGH = 0.55, 0.8


@register_task
class Dyck1(Task):
    name = "dyck1"

    def symbols(self) -> list[str]:
        return ["(", ")", "<invalid>", "<open>", "<balanced>"]

    def body_len(self, n: int) -> int:
        return n

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        close_p = CLOSE_LOW + (CLOSE_HIGH - CLOSE_LOW) * torch.rand(count, generator=generator)
        breaks = torch.rand(count, generator=generator) < BREAK_FRACTION
        break_at = torch.randint(0, n, (count,), generator=generator)
        u = torch.rand((count, n), generator=generator)
        level = torch.zeros(count, dtype=torch.long)
        armed = breaks.clone()
        steps = torch.empty((count, n), dtype=torch.long)
        for i in range(n):
            fire = armed & (level == 0) & (i >= break_at)
            close = torch.where(level == 0, fire, u[:, i] < close_p)
            steps[:, i] = 1 - 2 * close.long()
            level = (level + steps[:, i]).clamp(min=0)
            armed &= ~fire
        depth = steps.cumsum(dim=1)
        invalid = depth.cummin(dim=1).values < 0
        classes = torch.where(invalid, 0, torch.where(depth > 0, 1, 2))
        tokens = self.ids("(", ")")[(steps < 0).long()]
        labels = self.ids("<invalid>", "<open>", "<balanced>")[classes]
        return tokens, labels
