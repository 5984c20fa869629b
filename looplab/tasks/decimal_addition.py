"""Decimal addition, least significant digit first, in an aligned layout.

An instance of size n is two n-digit numbers a, b (uniform random digits,
leading zeros allowed). The sequence has n + 1 positions: position i < n holds
the pair token ``a_i b_i`` (one of 100, "00".."99") and position n holds
``<end>``. The answer region is every position: position i must predict digit i
of a + b, an (n+1)-digit number, as an output token "d0".."d9".

Why aligned: as in ``binary_addition``, digit i of the sum depends only on the
digits at i and the carry from i - 1, so one loop moves the carry one position
and T(n) = n + 1 loops suffice. Output digits are tokens of their own ("d3",
not "3"), because an input pair like "03" must not share an id with an answer.
"""

import torch
from torch import Tensor

from looplab.tasks.base import Task, register_task

PAIRS = [f"{a}{b}" for a in range(10) for b in range(10)]
DIGITS = [f"d{d}" for d in range(10)]


@register_task
class DecimalAddition(Task):
    name = "decimal_addition"

    def symbols(self) -> list[str]:
        return PAIRS + ["<end>"] + DIGITS

    def seq_len(self, n: int) -> int:
        return n + 1

    def steps(self, n: Tensor) -> Tensor:
        return n + 1

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a = torch.randint(0, 10, (count, n), generator=generator)
        b = torch.randint(0, 10, (count, n), generator=generator)
        end = self.token_id["<end>"]
        tokens = torch.cat([self.ids(*PAIRS)[10 * a + b], torch.full((count, 1), end)], dim=1)
        digits = torch.zeros((count, n + 1), dtype=torch.long)
        carry = torch.zeros(count, dtype=torch.long)
        for i in range(n):
            total = a[:, i] + b[:, i] + carry
            digits[:, i] = total % 10
            carry = total // 10
        digits[:, n] = carry
        labels = self.ids(*DIGITS)[digits]
        return tokens, labels
