"""Unique set: the distinct symbols of a sequence, in order of first appearance.

An instance of size n is n symbols x_1..x_n drawn uniformly from an alphabet of
``alphabet`` symbols (default 8, so by n = 9 every row repeats a symbol and
repeats are common well before). The sequence is x_1..x_n, ``<sep>``, then n
``<q>`` slots (2n + 1 positions). Slot j must predict the j-th distinct symbol
in order of first appearance, or ``<none>`` once the distinct symbols run out.

Why this layout: as in ``copy``, the answer needs its own slots, but here the
slot a symbol lands in depends on how many new symbols came before it, which a
fixed routing rule cannot know; the model must count, one position per loop,
hence T(n) = n. ``<none>`` is an output token of its own so a padded answer is
still whole-answer exact match over all n slots.
"""

import torch
from torch import Tensor

from looplab.tasks.base import IGNORE, QUERY, SEP, Task, register_task
from looplab.tasks.copy_task import alphabet_symbols


@register_task
class UniqueSet(Task):
    name = "unique_set"

    def symbols(self) -> list[str]:
        return alphabet_symbols(self.alphabet) + ["<none>"]

    def body_len(self, n: int) -> int:
        return 2 * n + 1

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x = self.ids(*alphabet_symbols(self.alphabet))[torch.randint(0, self.alphabet, (count, n), generator=generator)]
        # seen[b, i]: x_i equals some earlier x_j (j < i) in row b.
        earlier = torch.ones((n, n), dtype=torch.bool).tril(-1)
        seen = ((x[:, :, None] == x[:, None, :]) & earlier).any(dim=2)
        # A stable sort on "seen" moves first occurrences to the front, in order.
        seen_sorted, order = torch.sort(seen.to(torch.uint8), dim=1, stable=True)
        answer = torch.where(seen_sorted.bool(), self.token_id["<none>"], x.gather(1, order))
        tokens = torch.cat([x, torch.full((count, 1), SEP), torch.full((count, n), QUERY)], dim=1)
        labels = torch.cat([torch.full((count, n + 1), IGNORE), answer], dim=1)
        return tokens, labels
