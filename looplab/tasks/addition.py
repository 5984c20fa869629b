"""Binary and decimal addition, least significant digit first, in an aligned layout.

An instance of size n is two n-digit base-b numbers a, b (uniform random
digits, leading zeros allowed). The sequence has n + 1 positions: position
i < n holds the pair token ``a_i b_i`` and position n holds ``<end>``. The
answer region is every position: position i must predict digit i of a + b,
an (n+1)-digit number.

Why aligned: digit i of the sum depends only on the digits at i and the carry
from i - 1, so one loop can move the carry one position; T(n) = n + 1 loops
suffice, and nothing depends on absolute positions, which keeps length
extrapolation a question of the learned algorithm, not of the layout.

Output digits have tokens of their own where they could be confused with an
input pair (decimal "d3", not "3", since "03" is a pair).
"""

import torch
from torch import Tensor

from looplab.tasks.base import Task, register_task


class AlignedAddition(Task):
    """Addition in base ``base`` with pair tokens ``pairs`` and answer tokens ``outputs``."""

    base: int
    pairs: list[str]
    outputs: list[str]

    def symbols(self) -> list[str]:
        return self.pairs + ["<end>"] + self.outputs

    def body_len(self, n: int) -> int:
        return n + 1

    def steps(self, n: Tensor) -> Tensor:
        return n + 1

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a = torch.randint(0, self.base, (count, n), generator=generator)
        b = torch.randint(0, self.base, (count, n), generator=generator)
        end = torch.full((count, 1), self.token_id["<end>"])
        tokens = torch.cat([self.ids(*self.pairs)[self.base * a + b], end], dim=1)
        digits = torch.zeros((count, n + 1), dtype=torch.long)
        carry = torch.zeros(count, dtype=torch.long)
        for i in range(n):
            total = a[:, i] + b[:, i] + carry
            digits[:, i] = total % self.base
            carry = total // self.base
        digits[:, n] = carry
        return tokens, self.ids(*self.outputs)[digits]


@register_task
class BinaryAddition(AlignedAddition):
    name = "binary_addition"
    base = 2
    pairs = ["00", "01", "10", "11"]
    outputs = ["0", "1"]


@register_task
class DecimalAddition(AlignedAddition):
    name = "decimal_addition"
    base = 10
    pairs = [f"{a}{b}" for a in range(10) for b in range(10)]
    outputs = [f"d{d}" for d in range(10)]
