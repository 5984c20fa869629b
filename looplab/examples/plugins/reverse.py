"""A task plugin: write the n input symbols backwards into n answer slots.

Copy's layout (x_1..x_n ``<sep>`` then n ``<q>`` slots), but slot j predicts
x_{n+1-j}: slot j's symbol lies 2j - 1 positions back, so the distance grows
with j and, under local attention, so do the loops an answer needs: T(n) = n.
"""

import torch
from torch import Tensor

from looplab.tasks.base import IGNORE, register_task
from looplab.tasks.copy_task import CopyTask


@register_task
class Reverse(CopyTask):
    name = "reverse"

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        tokens, _ = super()._sample_rows(n, count, generator)
        labels = torch.cat([torch.full((count, n + 1), IGNORE), tokens[:, :n].flip(1)], dim=1)
        return tokens, labels
