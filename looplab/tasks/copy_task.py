"""Copy: reproduce n symbols in answer slots after a separator.

An instance of size n is n symbols x_1..x_n drawn uniformly from an alphabet of
``alphabet`` symbols. The sequence is x_1..x_n, ``<sep>``, then n ``<q>`` slots
(2n + 1 positions); slot j must predict x_j. Every other position is ignored.

Why slots: answers are produced non-autoregressively, so the answer needs its
own positions to be written into; the distance from slot j back to x_j is the
same for every j, so one routing rule solves all of them. T(n) = n gives the
model one loop per symbol to move, the budget a sequential copier would need.
"""

import torch
from torch import Tensor

from looplab.tasks.base import IGNORE, QUERY, SEP, Task, register_task


def alphabet_symbols(size: int) -> list[str]:
    """Names of ``size`` alphabet symbols: "a".."z", then "a1".."z1", and so on."""
    return [chr(ord("a") + i % 26) + (str(i // 26) if i >= 26 else "") for i in range(size)]


@register_task
class CopyTask(Task):
    name = "copy"

    def symbols(self) -> list[str]:
        return alphabet_symbols(self.alphabet)

    def body_len(self, n: int) -> int:
        return 2 * n + 1

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x = self.ids(*self.symbols())[torch.randint(0, self.alphabet, (count, n), generator=generator)]
        tokens = torch.cat([x, torch.full((count, 1), SEP), torch.full((count, n), QUERY)], dim=1)
        labels = torch.cat([torch.full((count, n + 1), IGNORE), x], dim=1)
        return tokens, labels
