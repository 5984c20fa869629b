"""Each row of a decode batch stopping by an exit of its own, up to a loop cap of its own: how the server
runs requests of different exits and caps as rows of one :class:`~looplab.generation.step.Decoder`.

A decode step's loop runs to the deepest cap any row holds; at loop t each running row's token is tested by
its own row's exit (rows grouped by exit, each exit's test on its rows only, so an exit sees what it would
see alone), and a row stops at its own cap whatever its exit says.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.token_exits import Carried, GenerationExit

__all__ = ["RowExits"]


class RowExits:
    """The exit of each of ``rows`` rows (``exits``, one per row; rows given a new one by :meth:`set`).

    Attributes:
        rules: the distinct exits the rows hold; ``ids`` [B] long: each row's, as an index into ``rules``;
        ``caps`` [B] long: each row's loop cap.
    """

    def __init__(self, exits: list[GenerationExit], device):
        self.rules: list[GenerationExit] = []
        self.ids = torch.zeros(len(exits), dtype=torch.long, device=device)
        self.caps = torch.zeros(len(exits), dtype=torch.long, device=device)
        self.set(range(len(exits)), exits)

    def set(self, rows, exits) -> None:
        """Row ``rows[i]`` stops by ``exits[i]`` from now on."""
        for row, rule in zip(rows, exits, strict=True):
            if rule not in self.rules:
                self.rules.append(rule)
            self.ids[row], self.caps[row] = self.rules.index(rule), rule.loops

    def present(self, rows: Tensor) -> list[int]:
        """The exits ``rows`` hold, as indices into ``rules`` (no lookup where every row holds one exit)."""
        return [0] if len(self.rules) == 1 else self.ids[rows].unique().tolist()

    def reads_logits(self, rows: Tensor) -> bool:
        """Whether the exit of any of ``rows`` reads each loop's logits."""
        return any(self.rules[k].reads_logits for k in self.present(rows))

    def check(self, rows: Tensor, t: int, h: Tensor, h_prev: Tensor, logp, logp_prev, carried: Carried, at) -> Tensor:
        """[R] bool: whether the token of each of ``rows`` stops after loop t, by its row's exit (h, h_prev [R, d]
        its states after and before the loop; logp, logp_prev [R, V] or None); ``carried`` holds what each exit
        carries across checks, the rows' at places ``at`` [R], and takes what they carry on."""

        def test(rule: GenerationExit, index, state):
            return rule.check(t, *_part(index, h, h_prev, logp, logp_prev), state)

        return self._by_exit(rows, at, carried, test)

    def check_rows(self, rows: Tensor, loops: Tensor, h: Tensor, h_prev: Tensor, logp, logp_prev, carried) -> Tensor:
        """:meth:`check` for rows each after its own loop ``loops`` [R] (depth-wise batching), each row's token
        carrying its exit's state at its own row's place in ``carried``."""

        def test(rule: GenerationExit, index, state):
            return rule.check_rows(loops[index], *_part(index, h, h_prev, logp, logp_prev), state)

        return self._by_exit(rows, rows, carried, test)

    def _by_exit(self, rows: Tensor, at: Tensor, carried: Carried, test) -> Tensor:
        """Each exit's ``test(rule, index, state)`` on its rows (``index`` into ``rows``; every row's where one
        exit holds them all), with the state they carry at places ``at``; the [R] bool stops."""
        present = self.present(rows)
        if len(present) == 1:
            rule = self.rules[present[0]]
            stop, state = test(rule, slice(None), carried.of(rule, at))
            carried.put(rule, at, state)
            return stop
        ids = self.ids[rows]
        stop = torch.zeros(len(ids), dtype=torch.bool, device=rows.device)
        for k in present:
            rule, index = self.rules[k], (ids == k).nonzero(as_tuple=True)[0]
            stop[index], state = test(rule, index, carried.of(rule, at[index]))
            carried.put(rule, at[index], state)
        return stop


def _part(index, *tensors: Tensor | None) -> list[Tensor | None]:
    """Each of ``tensors`` at ``index`` (None stays None)."""
    return [None if x is None else x[index] for x in tensors]
