"""Sudoku: fill in the blanks of a board with a unique solution (``sudoku4``: 4×4, ``sudoku9``: 9×9,
``sudoku9_hard``: 9×9 boards that singles cannot complete).

An instance of size n is a board with n blank cells. The sequence is the board
row by row, one token per cell (a digit, or ``.`` for a blank), and every cell
is in the answer region: cell i must hold the solution's digit (the givens are
copied, as in TRM's and HRM's full-board output). A board is answered when
every cell is right.

Generation, from the run's generator only:
1. a solved board: the pattern (b·(r mod b) + ⌊r/b⌋ + c) mod s, its digits
   permuted, rows shuffled within bands and bands among themselves, the same
   for columns and stacks, and a transpose half of the time;
2. blanks: cells in a random order are blanked one by one, each kept blank only
   if the board can still be completed by naked and hidden singles alone. Such
   a board has exactly one solution (each step is forced), and its difficulty
   is "easy" in the puzzle-rating sense. A board that runs out of cells before
   reaching n blanks is drawn again.

The size axis is the blank count: train on few blanks, test on more. The
singles rule reaches 11–12 blanks on a 4×4 board and 55–58 on a 9×9 one, so
``max_size`` is 11 and 55. T(n) = n: a sequential solver fills one blank per step.

``sudoku9_hard`` keeps a cell blank while the board still has exactly one
solution (counted by a backtracking solver), and keeps a board only if naked
and hidden singles cannot complete it: every such board needs at least one
guess or a technique beyond singles, the property Sudoku-Extreme's puzzles are
chosen for (theirs for many guesses). About 17 % of unique boards with 50
blanks and 30 % with 55 are such boards, and almost none below 45, so its sizes
are 50..56.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.tasks.base import Task, register_task

BLANK = "."
#: boards drawn for one instance before giving up on reaching its blank count
MAX_ATTEMPTS = 50
#: the same for a hard board, most of which singles still complete (at 50 blanks about 5 in 6)
HARD_ATTEMPTS = 400


def solved_board(side: int, generator: torch.Generator) -> list[list[int]]:
    """A random solved ``side`` × ``side`` board (digits 1..side)."""
    box = math.isqrt(side)

    def shuffled_lines() -> list[int]:  # bands in random order, lines shuffled within each band
        bands = torch.randperm(box, generator=generator).tolist()
        return [band * box + line for band in bands for line in torch.randperm(box, generator=generator).tolist()]

    rows, cols = shuffled_lines(), shuffled_lines()
    digits = (torch.randperm(side, generator=generator) + 1).tolist()
    board = [[digits[(box * (r % box) + r // box + c) % side] for c in cols] for r in rows]
    if bool(torch.rand((), generator=generator) < 0.5):
        board = [list(column) for column in zip(*board)]
    return board


def _units(side: int) -> list[list[tuple[int, int]]]:
    """Every row, column and box as a list of cells."""
    box = math.isqrt(side)
    rows = [[(r, c) for c in range(side)] for r in range(side)]
    cols = [[(r, c) for r in range(side)] for c in range(side)]
    boxes = [
        [(br + r, bc + c) for r in range(box) for c in range(box)]
        for br in range(0, side, box)
        for bc in range(0, side, box)
    ]
    return rows + cols + boxes


def _seen(board: list[list[int]], r: int, c: int) -> set[int]:
    """The values (0 for blanks) in cell (r, c)'s row, column and box."""
    side, box = len(board), math.isqrt(len(board))
    br, bc = r - r % box, c - c % box
    seen = {board[r][j] for j in range(side)} | {board[i][c] for i in range(side)}
    return seen | {board[br + i][bc + j] for i in range(box) for j in range(box)}


def solve_by_singles(board: list[list[int]]) -> list[list[int]] | None:
    """The board (0 = blank) completed by naked and hidden singles alone, or None when they get stuck."""
    side = len(board)
    grid = [row[:] for row in board]
    units = _units(side)
    everything = set(range(1, side + 1))
    while True:
        blanks = [(r, c) for r in range(side) for c in range(side) if grid[r][c] == 0]
        if not blanks:
            return grid
        candidates = {(r, c): everything - _seen(grid, r, c) for r, c in blanks}
        placed = False
        for cell, options in candidates.items():
            if not options:
                return None
            if len(options) == 1:
                grid[cell[0]][cell[1]] = next(iter(options))
                placed = True
        if not placed:
            for unit in units:
                for digit in range(1, side + 1):
                    spots = [cell for cell in unit if digit in candidates.get(cell, ())]
                    if len(spots) == 1 and grid[spots[0][0]][spots[0][1]] == 0:
                        grid[spots[0][0]][spots[0][1]] = digit
                        placed = True
        if not placed:
            return None


def count_solutions(board: list[list[int]], limit: int = 2) -> int:
    """Solutions of the board (0 = blank), counted up to ``limit``: depth-first search on the blank with
    the fewest candidates, digits kept as bit masks per row, column and box."""
    side, box = len(board), math.isqrt(len(board))
    every = (1 << (side + 1)) - 2  # bits 1..side
    rows, cols, boxes = [0] * side, [0] * side, [0] * side
    blanks = []
    for r in range(side):
        for c in range(side):
            b = (r // box) * box + c // box
            if board[r][c]:
                bit = 1 << board[r][c]
                rows[r], cols[c], boxes[b] = rows[r] | bit, cols[c] | bit, boxes[b] | bit
            else:
                blanks.append((r, c, b))
    found = 0

    def search(remaining: list[tuple[int, int, int]]) -> bool:  # True once ``limit`` solutions are found
        nonlocal found
        if not remaining:
            found += 1
            return found >= limit
        pick, free, fewest = 0, 0, side + 1
        for index, (r, c, b) in enumerate(remaining):
            options = every & ~(rows[r] | cols[c] | boxes[b])
            count = options.bit_count()
            if count < fewest:
                pick, free, fewest = index, options, count
                if count <= 1:
                    break
        r, c, b = remaining[pick]
        rest = remaining[:pick] + remaining[pick + 1 :]
        while free:
            bit = free & -free
            free ^= bit
            rows[r], cols[c], boxes[b] = rows[r] | bit, cols[c] | bit, boxes[b] | bit
            done = search(rest)
            rows[r], cols[c], boxes[b] = rows[r] ^ bit, cols[c] ^ bit, boxes[b] ^ bit
            if done:
                return True
        return False

    search(blanks)
    return found


def _forced(board: list[list[int]], r: int, c: int) -> bool:
    """Whether the blank cell (r, c) has one candidate left, given its row, column and box."""
    return len(_seen(board, r, c) - {0}) == len(board) - 1


def puzzle(
    side: int, blanks: int, generator: torch.Generator, hard: bool = False
) -> tuple[list[list[int]], list[list[int]]]:
    """(the board with ``blanks`` zeros, its unique solution), drawn from ``generator``: a board singles
    complete, or with ``hard`` one with a unique solution that singles cannot complete."""
    attempts = HARD_ATTEMPTS if hard else MAX_ATTEMPTS
    for _ in range(attempts):
        solution = solved_board(side, generator)
        board = [row[:] for row in solution]
        removed = 0
        for index in torch.randperm(side * side, generator=generator).tolist():
            if removed == blanks:
                break
            r, c = divmod(index, side)
            board[r][c] = 0
            # a cell its row, column and box still force (a naked single) can be blanked at no risk:
            # deducing it first gives back the board before, which singles complete (and which is unique)
            if _forced(board, r, c) or (count_solutions(board) == 1 if hard else solve_by_singles(board) is not None):
                removed += 1
            else:
                board[r][c] = solution[r][c]
        if removed == blanks and not (hard and solve_by_singles(board) is not None):
            return board, solution
    kind = "with one solution that singles cannot complete" if hard else "solvable by singles"
    raise LooplabError(f"no {side}x{side} board with {blanks} blanks {kind} in {attempts} draws")


class Sudoku(Task):
    """A ``side`` × ``side`` board; the size n is its blank count (``hard``: singles cannot complete it)."""

    side = 9
    hard = False

    def symbols(self) -> list[str]:
        return [BLANK, *(str(d) for d in range(1, self.side + 1))]

    def body_len(self, n: int) -> int:
        return self.side * self.side

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if n > self.max_size:
            raise LooplabError(f"{self.name} draws boards of at most {self.max_size} blanks, got {n}")
        blank = self.token_id[BLANK]
        digit = self.token_id["1"] - 1  # the id of digit d is digit + d
        tokens, labels = [], []
        for _ in range(count):
            board, solution = puzzle(self.side, n, generator, self.hard)
            tokens.append([blank if v == 0 else digit + v for row in board for v in row])
            labels.append([digit + v for row in solution for v in row])
        return torch.tensor(tokens, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


@register_task
class Sudoku4(Sudoku):
    name = "sudoku4"
    side = 4
    max_size = 11


@register_task
class Sudoku9(Sudoku):
    name = "sudoku9"
    side = 9
    max_size = 55


@register_task
class Sudoku9Hard(Sudoku):
    name = "sudoku9_hard"
    side = 9
    hard = True
    min_size = 50
    max_size = 56
