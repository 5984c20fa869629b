"""The registry of papers our sweeps are set beside, and what the report asks of each.

A paper is a registered :class:`Paper`: its name (``looplab report --paper NAME``, and the
prefix of its reproduction sweeps ``configs/sweeps/NAME-*.toml``), its title, the function that
builds its comparison tables (plus, optionally, tables read from the run dirs), and hooks for
figures of its own with their captions. The papers themselves (which of our groups matches which
paper row) live with their studies in :mod:`looplab.studies`, which registers them on import;
this module names none of them, and how one comparison table is built is in ``comparison.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from looplab.errors import choice_error
from looplab.plugins import register_entry
from looplab.report.comparison import PAPER_TABLES_DIR, Ours
from looplab.report.tables import Table

#: (report dir, results, sweep dir) → the figures written and the tables to write beside them (file name → frame)
FigureHook = Callable[[Path, pd.DataFrame, Path], tuple[list[Path], dict[str, pd.DataFrame]]]


@dataclass(frozen=True)
class Paper:
    """A paper compared against.

    Attributes:
        name: what ``--paper`` takes, and the prefix of its reproduction sweeps.
        title: the paper's title, as a report names it.
        tables: (our seed statistics, the paper-tables folder) → (tables, notes).
        run_tables: (results, sweep dir, paper-tables folder) → more tables read from the run dirs, or None.
        figures: figures of the paper's own runs, drawn in every report whose sweep holds such runs
            (nothing otherwise), or None.
        captions: figure kind (the file stem's last ``-`` part) → its caption.
        figures_after: table title → the figure kinds placed after that table.
        files: the names of the tables ``figures`` may write, so a report removes them when stale.
    """

    name: str
    title: str
    tables: Callable[[Ours, Path], tuple[list[Table], list[str]]]
    run_tables: Callable[[pd.DataFrame, Path, Path], list[Table]] | None = None
    figures: FigureHook | None = None
    captions: Mapping[str, str] = field(default_factory=dict)
    figures_after: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    @property
    def origin(self) -> str:
        return f"{self.tables.__module__}.{self.tables.__qualname__}"


PAPERS: dict[str, Paper] = {}


def register_paper(paper: Paper) -> Paper:
    """Make ``paper`` available to ``looplab report --paper``."""
    register_entry(PAPERS, paper.name, paper, "paper")
    return paper


def check_paper(paper: str) -> Paper:
    """The registered paper ``paper``; a one-line error naming the valid ones."""
    if paper not in PAPERS:
        raise choice_error("paper", paper, PAPERS)
    return PAPERS[paper]


def compare(paper: str, ours: Ours, tables_dir: Path | None = None) -> tuple[list[Table], list[str]]:
    """The comparison tables for ``paper`` and notes on what could not be compared."""
    return check_paper(paper).tables(ours, tables_dir or PAPER_TABLES_DIR)
