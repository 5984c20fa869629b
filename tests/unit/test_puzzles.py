"""The puzzle tasks against independent brute-force checkers: Sudoku boards have exactly one solution and
it is the label; a maze's marked path is its only shortest path."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from looplab.config import load_config
from looplab.errors import LooplabError
from looplab.experiment import check_config
from looplab.tasks import IGNORE, make_task


def _count_solutions(board: list[list[int]], limit: int = 2) -> int:
    """Solutions of a board (0 = blank) by plain backtracking over the emptiest cell, up to ``limit``."""
    side, box = len(board), math.isqrt(len(board))

    def options(r, c):
        used = set(board[r]) | {board[i][c] for i in range(side)}
        used |= {board[r - r % box + i][c - c % box + j] for i in range(box) for j in range(box)}
        return [d for d in range(1, side + 1) if d not in used]

    blanks = [(r, c) for r in range(side) for c in range(side) if board[r][c] == 0]
    if not blanks:
        return 1
    r, c = min(blanks, key=lambda cell: len(options(*cell)))
    found = 0
    for digit in options(r, c):
        board[r][c] = digit
        found += _count_solutions(board, limit - found)
        board[r][c] = 0
        if found >= limit:
            break
    return found


def _is_solved(board: list[list[int]]) -> bool:
    side, box = len(board), math.isqrt(len(board))
    units = [board[r] for r in range(side)] + [[board[r][c] for r in range(side)] for c in range(side)]
    units += [
        [board[br + i][bc + j] for i in range(box) for j in range(box)]
        for br, bc in itertools.product(range(0, side, box), repeat=2)
    ]
    return all(sorted(unit) == list(range(1, side + 1)) for unit in units)


def _singles_complete(board: list[list[int]]) -> bool:
    """Whether placing naked singles (a cell with one candidate) and hidden singles (a digit with one cell
    left in a row, column or box) again and again fills the board."""
    side, box = len(board), math.isqrt(len(board))
    board = [line[:] for line in board]
    units = [[(r, c) for c in range(side)] for r in range(side)] + [[(r, c) for r in range(side)] for c in range(side)]
    units += [[(br + i, bc + j) for i in range(box) for j in range(box)] for br in range(0, side, box)
              for bc in range(0, side, box)]  # fmt: skip

    def options(r, c):
        used = set(board[r]) | {board[i][c] for i in range(side)}
        used |= {board[r - r % box + i][c - c % box + j] for i in range(box) for j in range(box)}
        return {d for d in range(1, side + 1) if d not in used}

    while any(0 in line for line in board):
        placements = {(r, c): next(iter(o)) for r in range(side) for c in range(side)
                      if board[r][c] == 0 and len(o := options(r, c)) == 1}  # fmt: skip
        for unit in units:
            for digit in range(1, side + 1):
                spots = [(r, c) for r, c in unit if board[r][c] == 0 and digit in options(r, c)]
                if len(spots) == 1:
                    placements.setdefault(spots[0], digit)
        if not placements:
            return False
        for (r, c), digit in placements.items():
            board[r][c] = digit
    return True


def _boards(task, batch, row):
    side = task.side
    digits = {task.token_id[str(d)]: d for d in range(1, side + 1)}
    given = [digits.get(t, 0) for t in batch.tokens[row, 1:].tolist()]
    solved = [digits[t] for t in batch.labels[row, 1:].tolist()]
    return [given[i * side : (i + 1) * side] for i in range(side)], [
        solved[i * side : (i + 1) * side] for i in range(side)
    ]


@pytest.mark.parametrize("name, sizes", [("sudoku4", [1, 6, 11]), ("sudoku9", [5, 30, 55]), ("sudoku9_hard", [50, 56])])
def test_sudoku_boards_have_one_solution_and_it_is_the_label(name, sizes):
    task = make_task(name)
    for n in sizes:
        batch = task.sample(n, 6 if task.side == 4 else 3, torch.Generator().manual_seed(n))
        assert bool(batch.answer_mask[:, 1:].all()) and not bool(batch.answer_mask[:, 0].any())
        for row in range(len(batch.tokens)):
            given, solved = _boards(task, batch, row)
            assert sum(v == 0 for line in given for v in line) == n
            assert _is_solved(solved)
            assert all(g in (0, s) for gl, sl in zip(given, solved) for g, s in zip(gl, sl))
            assert _count_solutions([line[:] for line in given]) == 1
            assert _singles_complete(given) != task.hard  # hard boards need more than singles


def test_puzzles_are_a_function_of_the_seed():
    for name, n in (("sudoku9", 20), ("maze", 6)):
        task = make_task(name)
        first, again = (task.sample(n, 4, torch.Generator().manual_seed(3)) for _ in range(2))
        other = task.sample(n, 4, torch.Generator().manual_seed(4))
        assert torch.equal(first.tokens, again.tokens) and torch.equal(first.labels, again.labels)
        assert not torch.equal(first.tokens, other.tokens)


def _all_shortest_paths(grid: list[list[str]]) -> list[list[tuple[int, int]]]:
    """Every shortest S→G path, by depth-first enumeration within the BFS distance (an independent check)."""
    side = len(grid)
    (start,) = [(r, c) for r in range(side) for c in range(side) if grid[r][c] == "S"]
    (goal,) = [(r, c) for r in range(side) for c in range(side) if grid[r][c] == "G"]
    frontier, seen, depth = [start], {start}, 0
    while goal not in seen and frontier:
        depth += 1
        frontier = [
            (nr, nc)
            for r, c in frontier
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
            if 0 <= nr < side and 0 <= nc < side and grid[nr][nc] != "#" and (nr, nc) not in seen
        ]
        frontier = list(dict.fromkeys(frontier))
        seen |= set(frontier)
    paths = []

    def walk(path):
        if len(path) - 1 == depth:
            if path[-1] == goal:
                paths.append(path)
            return
        r, c = path[-1]
        for step in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            remaining = depth - len(path)
            if 0 <= step[0] < side and 0 <= step[1] < side and grid[step[0]][step[1]] != "#" and step not in path:
                if abs(step[0] - goal[0]) + abs(step[1] - goal[1]) <= remaining:
                    walk([*path, step])

    walk([start])
    return paths


@pytest.mark.parametrize("n", [2, 4, 7])
def test_a_maze_marks_its_only_shortest_path(n):
    task = make_task("maze")
    batch = task.sample(n, 8, torch.Generator().manual_seed(n))
    for row in range(len(batch.tokens)):
        symbols = [task.vocab[t] for t in batch.tokens[row, 1:].tolist()]
        labels = batch.labels[row, 1:].tolist()
        assert symbols[n :: n + 1] == ["|"] * n and all(labels[i] == IGNORE for i in range(n, len(labels), n + 1))
        grid = [symbols[r * (n + 1) : r * (n + 1) + n] for r in range(n)]
        answer = [[task.vocab[t] for t in labels[r * (n + 1) : r * (n + 1) + n]] for r in range(n)]
        (path,) = _all_shortest_paths(grid)  # exactly one
        assert len(path) - 1 >= n - 1
        for r, c in itertools.product(range(n), repeat=2):
            inside = (r, c) in path[1:-1]
            assert answer[r][c] == ("o" if inside else grid[r][c])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["task.name=sudoku4", "task.train_max=8", "task.eval_lengths=[4, 12]"],
            "task.eval_lengths must be <= 11 for task 'sudoku4'",
        ),
        (["task.name=sudoku9", "task.train_max=56"], "task.train_max must be <= 55 for task 'sudoku9'"),
        (["task.name=maze", "task.train_min=1"], "task.train_min must be >= 2 for task 'maze', got 1"),
        (
            ["task.name=sudoku9_hard", "task.train_min=40", "task.train_max=52", "task.eval_lengths=[52]"],
            "task.train_min must be >= 50 for task 'sudoku9_hard', got 40",
        ),
    ],
)
def test_sizes_a_puzzle_cannot_draw_are_refused_before_anything_runs(overrides, message):
    with pytest.raises(LooplabError, match=message):
        check_config(load_config(None, overrides))
