"""Committed results pages (docs/results/*.md) regenerated from their committed CSVs.

A page is hand-written prose with generated blocks in it:

    <!-- generated: stopping-confirm/arms-15 -->
    | arm | … |            ← rewritten from the CSVs by the block's generator
    <!-- end generated -->

A generator is a function ``(results_dir) -> markdown`` registered under the block's name
with :func:`register_block`; it reads only files under ``results_dir`` (the folder the pages
live in), so anyone with a clone can recompute every number a page shows. ``looplab results``
rewrites every block of every page; ``looplab results --check`` (and a test) fails when a
committed page differs from what its CSVs give.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from looplab.errors import LooplabError, choice_error
from looplab.io import atomic_write

BlockGenerator = Callable[[Path], str]
BLOCKS: dict[str, BlockGenerator] = {}
#: (sweep dirs, the study's folder) → its per-seed rows, written as the study's CSVs
Collector = Callable[[list[Path], Path], pd.DataFrame]
COLLECTORS: dict[str, Collector] = {}
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


def collector(study: str) -> Collector:
    """The registered collector of ``study``; a one-line error naming the valid ones."""
    _import_studies()
    if study not in COLLECTORS:
        raise choice_error("study for --collect", study, COLLECTORS)
    return COLLECTORS[study]


def _import_studies() -> None:
    from looplab.report import (  # noqa: F401  (they register on import)
        mechanistic_grid,
        mechanistic_retrofit,
        mechanistic_traces,
        mechanistic_trained,
        published,
        recursive,
        recursive_pages,
        stars_finetune,
        stars_retrofit,
        stars_stabilisers,
        stopping_confirm,
    )


def render_page(text: str, results_dir: Path, where: str = "page") -> str:
    """``text`` with every generated block rewritten by its generator (an unknown block is an error)."""

    def rewrite(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise LooplabError(f"{where}: unknown generated block {name!r}; known blocks: {', '.join(sorted(BLOCKS))}")
        body = BLOCKS[name](results_dir).rstrip("\n") + "\n"
        return match["open"] + body + match["close"]

    return _BLOCK.sub(rewrite, text)


def generated_pages(results_dir: Path) -> list[Path]:
    """The pages under ``results_dir`` that hold at least one generated block, sorted."""
    return sorted(p for p in Path(results_dir).glob("*.md") if _BLOCK.search(p.read_text(encoding="utf-8")))


def regenerate(results_dir: str | Path, check: bool = False) -> list[Path]:
    """Rewrite every generated page under ``results_dir`` (with ``check``: write nothing); the pages that
    changed (or, with ``check``, would change)."""
    _import_studies()

    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise LooplabError(f"results folder not found: {results_dir} (the committed pages live in docs/results)")
    changed = []
    for page in generated_pages(results_dir):
        text = page.read_text(encoding="utf-8")
        fresh = render_page(text, results_dir, str(page))
        if fresh != text:
            changed.append(page)
            if not check:
                atomic_write(page, lambda p, fresh=fresh: p.write_text(fresh, encoding="utf-8"))
    return changed
