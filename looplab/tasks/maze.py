"""Maze: mark the unique shortest path from start to goal on an n × n grid with walls.

An instance of size n is an n × n grid: each cell a wall ``#`` or free ``.``,
one free cell the start ``S`` and one the goal ``G``. The sequence is the grid
row by row, each row followed by ``|`` (so a model can tell rows apart at any
n): n (n + 1) positions. Every cell is in the answer region: cell i must read
as the input, except the free cells on the shortest path between S and G,
which read ``o`` (S and G stay). A grid is answered when every cell is right.

Generation, from the run's generator only: walls are independent with
probability 0.3; S is a random free cell; a breadth-first search from S counts
the shortest paths to every cell (capped at 2); G is drawn uniformly among the
cells reached by exactly one shortest path of at least n − 1 steps (so the
path crosses the grid). A grid without such a cell is drawn again.

The size axis is n: train on small grids, test on larger ones. T(n) = 2(n − 1),
the breadth-first depth that crosses an open grid corner to corner (walls make
some paths longer).
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.tasks.base import IGNORE, Task, register_task

WALL, FREE, START, GOAL, PATH, ROW_END = "#", ".", "S", "G", "o", "|"
WALL_PROBABILITY = 0.3
#: grids drawn for one instance before giving up
MAX_ATTEMPTS = 1000


def shortest_paths(walls: list[list[bool]], start: tuple[int, int]) -> tuple[dict, dict, dict]:
    """Breadth-first search from ``start``: (distance, number of shortest paths capped at 2, one predecessor)
    for every reachable cell."""
    side = len(walls)
    distance, count, parent = {start: 0}, {start: 1}, {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if not (0 <= nr < side and 0 <= nc < side) or walls[nr][nc]:
                continue
            if (nr, nc) not in distance:
                distance[nr, nc], count[nr, nc], parent[nr, nc] = distance[r, c] + 1, 0, (r, c)
                queue.append((nr, nc))
            if distance[nr, nc] == distance[r, c] + 1:
                count[nr, nc] = min(2, count[nr, nc] + count[r, c])
    return distance, count, parent


def maze(side: int, generator: torch.Generator) -> tuple[list[list[str]], list[list[str]]]:
    """(the grid, the grid with its unique shortest path marked), as rows of symbols."""
    for _ in range(MAX_ATTEMPTS):
        walls = (torch.rand((side, side), generator=generator) < WALL_PROBABILITY).tolist()
        free = [(r, c) for r in range(side) for c in range(side) if not walls[r][c]]
        if not free:
            continue
        start = free[int(torch.randint(len(free), (), generator=generator))]
        distance, count, parent = shortest_paths(walls, start)
        goals = sorted(cell for cell, steps in distance.items() if steps >= side - 1 and count[cell] == 1)
        if not goals:
            continue
        goal = goals[int(torch.randint(len(goals), (), generator=generator))]
        grid = [[WALL if walls[r][c] else FREE for c in range(side)] for r in range(side)]
        grid[start[0]][start[1]], grid[goal[0]][goal[1]] = START, GOAL
        solved = [row[:] for row in grid]
        cell = parent[goal]
        while cell != start:
            solved[cell[0]][cell[1]] = PATH
            cell = parent[cell]
        return grid, solved
    raise LooplabError(f"no {side}x{side} maze with a unique shortest path in {MAX_ATTEMPTS} draws")


@register_task
class Maze(Task):
    name = "maze"
    min_size = 2
    max_size = 32

    def symbols(self) -> list[str]:
        return [WALL, FREE, START, GOAL, PATH, ROW_END]

    def body_len(self, n: int) -> int:
        return n * (n + 1)

    def steps(self, n: Tensor) -> Tensor:
        return 2 * (n - 1).clamp_min(1)

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if not self.min_size <= n <= self.max_size:
            raise LooplabError(f"maze draws grids of side {self.min_size}..{self.max_size}, got {n}")
        tokens, labels = [], []
        for _ in range(count):
            grid, solved = maze(n, generator)
            tokens.append([self.token_id[s] for row in grid for s in [*row, ROW_END]])
            labels.append([label for row in solved for label in [*(self.token_id[s] for s in row), IGNORE]])
        return torch.tensor(tokens, dtype=torch.long), torch.tensor(labels, dtype=torch.long)
