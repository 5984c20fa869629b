"""Committed results pages (docs/results/*.md) regenerated from their committed CSVs.

A page is hand-written prose with generated blocks in it:

    <!-- generated: stopping-confirm/arms-15 -->
    | arm | … |            ← rewritten from the CSVs by the block's generator
    <!-- end generated -->

A generator is a function ``(results_dir) -> markdown`` registered under the block's name
with :func:`register_block`; it reads only files under ``results_dir`` (the folder the pages
live in), so anyone with a clone can recompute every number a page shows. ``looplab results``
rewrites every block of every page; ``looplab results --check`` (and a test) fails when a
committed page differs from what its CSVs give. The studies register their blocks and collectors
when :mod:`looplab.studies` is imported (the CLI imports it for ``results``); this module names none.
"""

from __future__ import annotations

import filecmp
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from looplab.errors import LooplabError, choice_error
from looplab.io import atomic_write, read_utf8_text
from looplab.report.preregistration import PROVENANCE_CSV, provenance_rows

BlockGenerator = Callable[[Path], str]
BLOCKS: dict[str, BlockGenerator] = {}
#: (sweep dirs, the study's folder) → its per-seed rows, written as the study's CSVs
Collector = Callable[[list[Path], Path], pd.DataFrame]
COLLECTORS: dict[str, Collector] = {}
#: a study decided by a protocol frozen before its runs → that protocol's path under the results folder
FROZEN: dict[str, str] = {}
_BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<name>[\w./-]+) -->\n)(?P<body>.*?)(?P<close><!-- end generated -->)", re.S
)


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    """A Markdown table from its header cells and rows of cells (strings)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def register_block(name: str) -> Callable[[BlockGenerator], BlockGenerator]:
    """Function decorator: the generator of the page block ``name``."""

    def register(generator: BlockGenerator) -> BlockGenerator:
        BLOCKS[name] = generator
        return generator

    return register


def register_collector(study: str) -> Callable[[Collector], Collector]:
    """Function decorator: how ``looplab results --collect DIR --study STUDY`` rebuilds the study's CSVs."""

    def register(collect: Collector) -> Collector:
        COLLECTORS[study] = collect
        return collect

    return register


def register_frozen(study: str, protocol: str) -> None:
    """Declare that ``study`` is decided by the frozen protocol at ``protocol`` (relative to the results
    folder, or absolute for a protocol kept in the package): ``looplab results --check`` fails when that
    file is missing."""
    FROZEN[study] = protocol


def collector(study: str) -> Collector:
    """The registered collector of ``study``; a one-line error naming the valid ones."""
    if study not in COLLECTORS:
        raise choice_error("study for --collect", study, COLLECTORS)
    return COLLECTORS[study]


def read_table(path: Path) -> pd.DataFrame:
    """A committed CSV, checked so that a fault names the file (and the row and column where there is one):
    empty, unparseable, cut off mid-line, or a non-number in a column of numbers."""
    where = str(path)
    text = path.read_bytes()
    if not text.strip():
        raise LooplabError(f"{where}: the file is empty (a results CSV holds a header and its rows)")
    if not text.endswith(b"\n"):
        lines = text.count(b"\n") + 1
        raise LooplabError(f"{where}: the file ends mid-line (its line {lines} is cut off)")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise LooplabError(f"{where}: not a readable CSV ({str(err).strip().splitlines()[0]})") from None
    for column in [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]:
        cells = frame[column].dropna()
        numbers = pd.to_numeric(cells, errors="coerce")
        strays = cells[numbers.isna()]
        if len(strays) and numbers.notna().sum() > len(cells) / 2:  # a column of numbers with a stray cell
            row = int(strays.index[0]) + 2  # the header is line 1
            raise LooplabError(f"{where}: line {row}, column {column!r}: {strays.iloc[0]!r} is not a number")
    return frame


def check_tables(results_dir: Path) -> None:
    """:func:`read_table` on every CSV under ``results_dir``."""
    for path in sorted(Path(results_dir).rglob("*.csv")):
        read_table(path)


def check_protocols(results_dir: Path) -> list[str]:
    """The frozen studies whose protocol file is missing under ``results_dir``, one line each."""
    return [
        f"{study}: its frozen protocol {protocol} is missing"
        for study, protocol in sorted(FROZEN.items())
        if (Path(results_dir) / study).is_dir() and not (Path(results_dir) / protocol).is_file()
    ]


def render_page(text: str, results_dir: Path, where: str = "page") -> str:
    """``text`` with every generated block rewritten by its generator (an unknown block is an error)."""

    def rewrite(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise LooplabError(f"{where}: unknown generated block {name!r}; known blocks: {', '.join(sorted(BLOCKS))}")
        try:
            body = BLOCKS[name](results_dir).rstrip("\n") + "\n"
        except KeyError as err:
            folder = name.split("/")[0]
            raise LooplabError(
                f"{where}: block {name}: a column it reads is missing from the CSVs under {folder}/: {err}"
            ) from None
        except (ValueError, TypeError, IndexError, AttributeError, pd.errors.EmptyDataError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            folder = name.split("/")[0]
            raise LooplabError(f"{where}: block {name}: its CSVs under {folder}/ do not give it: {reason}") from None
        return match["open"] + body + match["close"]

    return _BLOCK.sub(rewrite, text)


def generated_pages(results_dir: Path) -> list[Path]:
    """The pages under ``results_dir`` that hold at least one generated block, sorted."""
    return sorted(p for p in Path(results_dir).glob("*.md") if _BLOCK.search(read_utf8_text(p, "results page")))


def regenerate(results_dir: str | Path, check: bool = False) -> list[Path]:
    """Rewrite every generated page under ``results_dir`` (with ``check``: write nothing); the pages that
    changed (or, with ``check``, would change). Every page is rendered before the first is written, so a
    fault in one page's CSVs leaves all of them as they were."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise LooplabError(f"results folder not found: {results_dir} (the committed pages live in docs/results)")
    check_tables(results_dir)
    fresh_pages = {}
    for page in generated_pages(results_dir):
        text = read_utf8_text(page, "results page")
        fresh = render_page(text, results_dir, str(page))
        if fresh != text:
            fresh_pages[page] = fresh
    if not check:
        for page, fresh in fresh_pages.items():
            atomic_write(page, lambda p, fresh=fresh: p.write_text(fresh, encoding="utf-8"))
    return list(fresh_pages)


#: the columns that say which part of a study a row belongs to
IDENTITY_COLUMNS = ("task", "arm", "schedule", "recipe")


def _check_against_committed(fresh: Path, committed: Path) -> None:
    """Each collected CSV that the study has committed keeps its columns, and holds only the (task, arm, …)
    the committed one holds: rows of another study's runs are refused before anything is written."""
    for path in sorted(fresh.rglob("*.csv")):
        known = committed / path.relative_to(fresh)
        if not known.is_file():
            continue
        new, old = read_table(path), read_table(known)
        name = known.relative_to(committed.parent)
        if list(new.columns) != list(old.columns):
            raise LooplabError(f"its {name} would change columns (committed: {', '.join(old.columns)})")
        keys = [c for c in IDENTITY_COLUMNS if c in old.columns]
        if keys:
            allowed = set(old[keys].astype(str).itertuples(index=False, name=None))
            strange = sorted(set(new[keys].astype(str).itertuples(index=False, name=None)) - allowed)
            if strange:
                raise LooplabError(
                    f"{name} would gain {'/'.join(keys)} {', '.join('/'.join(k) for k in strange[:3])}, which the "
                    f"study does not have (it has {', '.join(sorted('/'.join(k) for k in allowed)[:6])}, …)"
                )


def collect(study: str, sweep_dirs: list[Path], results_dir: Path) -> pd.DataFrame:
    """Rebuild ``study``'s CSVs from ``sweep_dirs`` into ``results_dir/study``, all or nothing.

    The collector writes into a copy of the results folder, beside the runs' provenance
    (``provenance.csv``: :mod:`looplab.report.preregistration`); its files are checked (:func:`read_table`)
    and every page is rendered from the copy before one file of the real folder changes, so sweeps that
    are not the study's end in one line with the committed CSVs untouched. Changed files are then
    renamed into place one by one.
    """
    collect_rows = collector(study)
    results_dir = Path(results_dir)
    with tempfile.TemporaryDirectory(prefix="looplab-collect-") as scratch:
        trial = Path(scratch) / "results"
        if results_dir.is_dir():
            shutil.copytree(results_dir, trial)
        else:
            trial.mkdir()
        try:
            frame = collect_rows(sweep_dirs, trial / study)
            if frame.empty:
                raise LooplabError("no runs of this study in the sweep dir(s)")
            records = provenance_rows(sweep_dirs)
            if "run_id" in frame.columns:
                records = records[records["run_id"].isin(set(frame["run_id"].astype(str)))]
            records.to_csv(trial / study / PROVENANCE_CSV, index=False)
            check_tables(trial / study)
            _check_against_committed(trial / study, results_dir / study)
            for page in generated_pages(trial):
                render_page(page.read_text(encoding="utf-8"), trial, page.name)
        except (
            LooplabError,
            KeyError,
            ValueError,
            TypeError,
            IndexError,
            AttributeError,
            pd.errors.EmptyDataError,
        ) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise LooplabError(
                f"results --collect: the sweep(s) {', '.join(map(str, sweep_dirs))} do not give study {study}'s "
                f"results ({reason}); nothing under {results_dir / study} was changed"
            ) from None
        target = results_dir / study
        target.mkdir(parents=True, exist_ok=True)
        for fresh in sorted(p for p in (trial / study).rglob("*") if p.is_file()):
            into = target / fresh.relative_to(trial / study)
            if into.is_file() and filecmp.cmp(fresh, into, shallow=False):
                continue
            into.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(into, lambda p, fresh=fresh: shutil.copyfile(fresh, p))
    return frame
