"""One comparison table: our seed statistics per group beside a paper table's row for that group.

The paper numbers are read at report time from the CSVs in PAPER_TABLES_DIR
(``looplab/data/paper_tables``, shipped with the package, with the citation of
each file in its ``SOURCES.md``), never written into the code; a missing file
leaves a note in the report instead of failing it. ``paper.py`` holds what is
particular to each paper: which of our groups matches which paper row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import looplab
from looplab.report.tables import (
    MISSING,
    Table,
    cell,
    decimals,
    group_key,
    interval_cell,
    key_cells,
    metric_stats,
    seeds_cell,
    stats_by_group,
    std_cell,
)

CELL_NOTE = (
    "Each cell: ours / the paper's → where the paper's value lies against our interval; ours is the mean and"
    " its 95 % t-interval (a std: the std and its bootstrap interval)."
)
PAPER_TABLES_DIR = Path(looplab.__file__).resolve().parent / "data" / "paper_tables"


@dataclass(frozen=True)
class Ours:
    """The sweep's statistics the comparisons draw on.

    ``groups``/``long``: :func:`aggregate.group_sizes` and display-unit :func:`aggregate.aggregate`
    over ``by`` = (task.name, variant); ``results`` the per-run rows, for other groupings.
    """

    results: pd.DataFrame
    groups: pd.DataFrame
    long: pd.DataFrame
    by: list[str]


@dataclass(frozen=True)
class Pair:
    """A paper column and our statistic it compares with; ``metric`` None shows the paper's column alone,
    ``paper`` None our statistic alone (a measurement the paper does not report).

    ``stat`` "mean" shows our mean and its t-interval beside a paper value (mean ± std [t-interval]
    alone); "std" our std with its bootstrap interval (the paper's Std). ``place`` ends the cell with
    where the paper's value lies against our interval: "inside", "above" or "below".
    """

    header: str
    paper: str | None
    metric: str | None = None
    stat: str = "mean"
    place: bool = False


def place(value, low: float, high: float) -> str:
    """Where a paper ``value`` lies against our interval [low, high]: inside, above, below (– if either is missing)."""
    if not isinstance(value, (int, float)) or not (math.isfinite(low) and math.isfinite(high)):
        return MISSING
    return "above" if value > high else "below" if value < low else "inside"


def variant_stem(variant: str) -> str:
    """The config part of a variant, without its overrides: "fixed+train.steps=800" → "fixed"."""
    return str(variant).split("+", 1)[0]


def read_paper_table(name: str, tables_dir: Path) -> tuple[pd.DataFrame | None, list[str]]:
    """The paper CSV as strings (as printed: "<0.65" stays), or None and a note when it is missing."""
    path = tables_dir / name
    if not path.is_file():
        return None, [f"paper table {path} not found: its numbers are left out of this report"]
    return pd.read_csv(path, dtype=str, keep_default_na=False), []


def paper_value(text: str):
    """A number when the paper printed one, else the text (None when empty)."""
    try:
        return float(text)
    except ValueError:
        return text or None


def paper_name(text: str) -> str:
    """A paper key without its parenthesised gloss: "sandwich_output (ouro)" → "sandwich_output"."""
    return text.split(" (", 1)[0].strip()


def members(results: pd.DataFrame, group: dict) -> pd.DataFrame:
    """The result rows of one group (column → value, compared as text)."""
    for column, value in group.items():
        results = results[results[column].astype(str) == str(value)]
    return results


def side_by_side(
    title: str,
    ours: Ours,
    paper: pd.DataFrame,
    key: Callable[[dict], dict | None],
    pairs: list[Pair],
    note: str = "",
    name: str = "",
    judge: Callable[[dict], str] | None = None,
    describe: Callable[[pd.DataFrame], str] | None = None,
) -> Table | None:
    """One row per group of ``ours`` with a paper row, one compact cell per pair:
    "ours [interval] / paper → where the paper's value lies against our interval".

    ``key`` maps a group (column → value) to the paper columns that identify its row, or None
    when the paper has no counterpart. ``judge``, given a row's numbers (``ours.<column>`` and
    ``paper.<column>``), returns its verdict for a last "Reproduced" column. ``describe``, given a
    group's result rows, names what our variant is ("fixed K = 11") in an "Ours" column. Returns
    None when no group has a counterpart.
    """
    stats = stats_by_group(ours.long, ours.by)
    display, numbers = [], []
    for row in ours.groups[[*ours.by, "runs"]].itertuples(index=False, name=None):
        group, runs = dict(zip(ours.by, row[:-1])), row[-1]
        wanted = key(group)
        if wanted is None or any(v is None for v in wanted.values()):
            continue
        match = paper
        for column, value in wanted.items():
            match = match[match[column].map(paper_name) == value] if column in match.columns else match.iloc[:0]
        if match.empty:
            continue
        published = match.iloc[0]
        found = stats.get(group_key(row[:-1]))
        shown = {**key_cells(ours.by, row[:-1])}
        if describe is not None:
            shown["Ours"] = describe(members(ours.results, group))
        named = [str(v) for v in wanted.values() if str(v) not in map(str, group.values())]  # not shown already
        shown.update({"Seeds": seeds_cell(runs), "Paper row": " / ".join(named or [str(list(wanted.values())[-1])])})
        values = {**group, "runs": runs, **{f"paper.{c}": v for c, v in wanted.items()}}
        for pair in pairs:
            column = pair.paper or pair.metric
            if pair.metric is None:  # the paper's column alone
                shown[pair.header] = published[pair.paper] or MISSING
                values[f"paper.{pair.paper}"] = paper_value(published[pair.paper])
                continue
            s, digits = metric_stats(found, pair.metric), decimals(pair.metric)
            bounds = ("ci_lo", "ci_hi") if pair.stat == "mean" else ("std_lo", "std_hi")
            values[f"ours.{column}"] = s[pair.stat]
            values.update({f"ours.{column}.{b}": s[b] for b in bounds})
            if not pair.paper:  # ours alone: the full cell
                shown[pair.header] = cell(s, digits) if pair.stat == "mean" else std_cell(s, digits)
                continue
            values[f"paper.{pair.paper}"] = paper_value(published[pair.paper])
            ours_text = interval_cell(s, digits) if pair.stat == "mean" else std_cell(s, digits)
            shown[pair.header] = f"{ours_text} / {published[pair.paper] or MISSING}"
            if pair.place:
                where = place(values[f"paper.{pair.paper}"], *(float(s[b]) for b in bounds))
                values[f"place.{column}"] = where
                shown[pair.header] += f" → {where}"
        if judge is not None:
            shown["Reproduced"] = values["reproduced"] = judge(values)
        display.append(shown)
        numbers.append(values)
    if not display:
        return None
    return Table(title, pd.DataFrame(display), pd.DataFrame(numbers), note, name)


def compare_table(
    title: str,
    file: str,
    ours: Ours,
    tables_dir: Path,
    key,
    pairs,
    judge=None,
    note: str = "",
    describe=None,
    derive=None,
) -> tuple[list[Table], list[str]]:
    """side_by_side against one paper CSV, with a note when the file or every counterpart is missing.

    ``derive`` adds columns to the paper frame (e.g. scale-free ratios) before the comparison.
    """
    paper, notes = read_paper_table(file, tables_dir)
    if paper is None:
        return [], notes
    if derive is not None:
        paper = derive(paper)
    cells = CELL_NOTE if any(p.paper and p.metric for p in pairs) else ""  # when a cell holds both sides
    lacking = [p.paper for p in pairs if p.paper and p.paper not in paper.columns]
    if lacking:
        return [], [f"paper table {file} lacks column(s) {', '.join(lacking)}: left out of this report"]
    table = side_by_side(
        title,
        ours,
        paper,
        key,
        pairs,
        " ".join(filter(None, [f"paper numbers from {file}.", cells, note])),
        f"paper_{Path(file).stem}",
        judge,
        describe,
    )
    if table is None:
        return [], [f"no group of this sweep has a counterpart in {file}"]
    return [table], []
