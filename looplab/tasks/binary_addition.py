"""Binary addition, least significant bit first, in an aligned layout.

An instance of size n is two n-bit numbers a, b (uniform random bits). The
sequence has n + 1 positions: position i < n holds the pair token ``a_i b_i``
(one of four) and position n holds ``<end>``. The answer region is every
position: position i must predict bit i of a + b, an (n+1)-bit number.

Why aligned: bit i of the sum depends on bits i and on the carry from i - 1,
so one loop can move the carry one position; T(n) = n + 1 loops suffice, and
nothing depends on absolute positions, which keeps length extrapolation a
question of the learned algorithm, not of the layout.
"""

import torch
from torch import Tensor

from looplab.tasks.base import Task, register_task


@register_task
class BinaryAddition(Task):
    name = "binary_addition"

    def symbols(self) -> list[str]:
        return ["00", "01", "10", "11", "<end>", "0", "1"]

    def seq_len(self, n: int) -> int:
        return n + 1

    def steps(self, n: Tensor) -> Tensor:
        return n + 1

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a = torch.randint(0, 2, (count, n), generator=generator)
        b = torch.randint(0, 2, (count, n), generator=generator)
        pair_ids = self.ids("00", "01", "10", "11")
        end = self.token_id["<end>"]
        tokens = torch.cat([pair_ids[2 * a + b], torch.full((count, 1), end)], dim=1)
        bits = torch.zeros((count, n + 1), dtype=torch.long)
        carry = torch.zeros(count, dtype=torch.long)
        for i in range(n):
            total = a[:, i] + b[:, i] + carry
            bits[:, i] = total % 2
            carry = total // 2
        bits[:, n] = carry
        labels = self.ids("0", "1")[bits]
        return tokens, labels
