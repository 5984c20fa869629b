"""Parity: the XOR of n bits, read at one answer slot.

An instance of size n is n uniform random bits. The sequence is the bits as
tokens "0"/"1", then one ``<q>`` slot (n + 1 positions). The slot must predict
the XOR of the bits as the output token "even" (XOR 0) or "odd" (XOR 1); every
other position is ignored.

Why a single slot with its own output tokens: the answer is one symbol, and
giving it distinct tokens keeps inputs and answers apart in the vocabulary (the
same choice ``decimal_addition`` makes). T(n) = n: a sequential solver folds in
one bit per step.
"""

import torch
from torch import Tensor

from looplab.tasks.base import IGNORE, QUERY, Task, register_task


@register_task
class Parity(Task):
    name = "parity"

    def symbols(self) -> list[str]:
        return ["0", "1", "even", "odd"]

    def body_len(self, n: int) -> int:
        return n + 1

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        bits = torch.randint(0, 2, (count, n), generator=generator)
        tokens = torch.cat([self.ids("0", "1")[bits], torch.full((count, 1), QUERY)], dim=1)
        labels = torch.full((count, n + 1), IGNORE)
        labels[:, n] = self.ids("even", "odd")[bits.sum(dim=1) % 2]
        return tokens, labels
