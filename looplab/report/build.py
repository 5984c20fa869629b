"""``write_report``: a sweep directory → ``DIR/report/`` (tables, figures, one self-contained page).

    table.csv          every metric's n, mean, std, ci_lo, ci_hi per (task, variant), display units
    table.md, .tex     the same as "mean ± std [lo, hi]" cells, plus any paper comparison
    paper_<name>.csv   each paper comparison's numbers, ours and the paper's side by side
    <task>-<kind>.png  accuracy heatmaps, Oracle(n), flip rates, policy depths, test-time scaling
    report.html        all of it in one file, figures embedded as data: URIs

plus what a registered paper draws of its own runs wherever the sweep holds them (its ``figures``
hook: the STARS study's looped-LM curves and ``lm_curves.csv``, for one). The engine names no
study; the studies register their papers when :mod:`looplab.studies` is imported.

Everything is recomputed from results.parquet and the runs' eval files; a
figure or file that this run did not write (stale, from an earlier report) is removed.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from looplab.errors import LooplabError
from looplab.io import atomic_write
from looplab.plugins import load_plugins
from looplab.provenance import code_version
from looplab.report.aggregate import (
    BOOTSTRAP_SEED,
    FEW_SEEDS,
    HEADLINE_METRICS,
    LEVEL,
    LM_METRICS,
    RESAMPLES,
    SCALING_METRICS,
    aggregate,
    analysis_metrics,
    group_sizes,
    in_display_units,
    present,
)
from looplab.report.comparison import PAPER_TABLES_DIR, Ours
from looplab.report.html import Section, to_html
from looplab.report.paper import PAPERS, check_paper, compare
from looplab.report.plots import CAPTIONS, write_task_plots
from looplab.report.render import to_latex, to_markdown
from looplab.report.runs import RESULTS_FILE, add_scaling_metrics, load_run_tables, per_length_frame, read_results
from looplab.report.tables import UNDEFINED, Table, seed_table
from looplab.report.variants import training_depth

REPORT_DIR = "report"
BY = ["task.name", "variant"]


def method_notes(results: pd.DataFrame) -> list[str]:
    """How to read the cells; stated in every report so the numbers never travel without it."""
    notes = [
        f"{len(results)} finished runs. Cells: mean ± std [{LEVEL:.0%} interval] over seeds (the runs of one "
        f"task × variant). Std is the sample std (ddof = 1), absent for a single seed; the interval is the "
        f"Student-t interval of the mean (absent for a single seed). In the comparisons a Std is shown with a "
        f"percentile bootstrap interval ({RESAMPLES} resamples, seed {BOOTSTRAP_SEED}). A seed count marked "
        f"(few) is below {FEW_SEEDS}: its intervals are rough.",
        "Accuracies and rates in %; Gap, and the std of a percent metric (the paper's Std), in percentage "
        "points (pp); Front@90 is a length, averaged over seeds.",
        f"A metric a run does not define (no OOD length, no passing length for Front@90, no loop pair for the "
        f"flip rate) is left out of its cell, not counted as 0; a cell no seed defines reads {UNDEFINED!r}.",
        _flip_note(results),
    ]
    if "status" in results.columns:
        notes.append(
            "Diverged: runs whose training diverged. They have no metrics, so a cell's statistics "
            "are over the other seeds."
        )
    return notes


def _flip_note(results: pd.DataFrame) -> str:
    """Which K the flip rate averages over (docs/methods.md §5), and whether the runs share that range."""
    text = "Flip rate: the mean of the flip curve Pr[ŷ_(K+1) ≠ ŷ_K] (OOD samples) over K in "
    if "flip_range" not in results.columns:
        return text + "each run's own range (its summaries predate flip_range; re-evaluate to compare)."
    ranges = sorted({str(r) for r in results["flip_range"].dropna()})
    if len(ranges) == 1:
        return text + f"{ranges[0]}, the same for every run."
    return text + f"ranges that differ between runs ({', '.join(ranges)}): compare flip rates within one range only."


def sweep_statistics(results: pd.DataFrame) -> Ours:
    """Seed statistics per (task, variant) of every metric the sweep measured, in display units."""
    metrics = [*present(results, (*HEADLINE_METRICS, *SCALING_METRICS, *LM_METRICS)), *analysis_metrics(results)]
    return Ours(results, group_sizes(results, BY), in_display_units(aggregate(results, BY, metrics)), BY)


def our_tables(ours: Ours) -> list[Table]:
    """Results for every group; then scaling, language modelling and analysis for the groups that measured them."""
    tables = [seed_table("Results", ours.groups, ours.long[ours.long["metric"].isin(HEADLINE_METRICS)], ours.by)]
    for title, candidates in (
        ("Test-time scaling", SCALING_METRICS),
        ("Language modelling", LM_METRICS),
        ("Mechanistic analysis", analysis_metrics(ours.results)),
    ):
        long = ours.long[ours.long["metric"].isin(present(ours.results, candidates))]
        measured = long.loc[long["n"] > 0, ours.by].drop_duplicates()
        if not measured.empty:
            tables.append(seed_table(title, ours.groups.merge(measured, on=ours.by), long, ours.by))
    return tables


def sweep_line(results: pd.DataFrame) -> str:
    """What the sweep holds, in one line."""
    tasks = results["task.name"].nunique() if "task.name" in results else 0
    variants = results["variant"].nunique() if "variant" in results else 0
    seeds = results.groupby(BY).size() if set(BY) <= set(results.columns) else pd.Series([len(results)])
    low, high = int(seeds.min()), int(seeds.max())
    return (
        f"{len(results)} finished runs: {tasks} task(s) × {variants} variant(s), "
        f"{low if low == high else f'{low}–{high}'} seed(s) each."
    )


def provenance(sweep_dir: Path) -> str:
    """Which looplab wrote the report, when, and from which sweep file (its SHA-256), in one line."""
    code = code_version()
    made_by = f"looplab {code['version']}" if code["version"] else "looplab (not installed)"
    if code["commit"]:
        made_by += f", commit {str(code['commit'])[:7]}" + (" with uncommitted changes" if code["dirty"] else "")
    sweep_file = sweep_dir / "sweep.toml"
    if sweep_file.is_file():
        sweep = f"sweep.toml sha256 {hashlib.sha256(sweep_file.read_bytes()).hexdigest()[:16]}"
    else:
        sweep = "no sweep.toml in the sweep dir"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"Provenance: {made_by}; {when}; {sweep}."


def sweep_plugins(results: pd.DataFrame) -> list[str]:
    """Every plugin module the sweep's runs name in ``[run] plugins``, in first-seen order."""
    found: dict[str, None] = {}
    for row, value in results.get("run.plugins", pd.Series(dtype=object)).dropna().items():
        try:
            names = json.loads(value) if isinstance(value, str) else list(value)
        except (json.JSONDecodeError, TypeError):
            names = None
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise LooplabError(f"{RESULTS_FILE}: run.plugins of row {row} is not a list of module names: {value!r}")
        found.update(dict.fromkeys(names))
    return list(found)


def train_depths(results: pd.DataFrame) -> dict[str, dict[str, float]]:
    """task → variant → the largest depth the variant trains at (for the figures' markers)."""
    found: dict[str, dict[str, float]] = {}
    if not set(BY) <= set(results.columns):
        return found
    for (task, variant), rows in results.groupby(BY):
        found.setdefault(task, {})[variant] = training_depth(rows.iloc[0])
    return found


FIGURES_AFTER = {
    "Results": ("accuracy", "oracle", "flips", "depths"),
    "Test-time scaling": ("scaling",),
}


def sections(tables: list[Table], figures: list[Path]) -> list[Section]:
    """Each table followed by its figures (FIGURES_AFTER and each paper's own); figures whose table is absent
    follow the first table."""
    after, captions = dict(FIGURES_AFTER), dict(CAPTIONS)
    for paper in PAPERS.values():
        after.update(paper.figures_after)
        captions.update(paper.captions)
    kind = {path: path.stem.rsplit("-", 1)[-1] for path in figures}
    placed: set[Path] = set()
    found = []
    for table in tables:
        kinds = after.get(table.title, ())
        mine = [p for p in figures if kind[p] in kinds]
        placed.update(mine)
        found.append(Section(table, [(p, captions.get(kind[p], "")) for p in mine]))
    rest = [(p, captions.get(kind[p], "")) for p in figures if p not in placed]
    if found:
        found[0].figures.extend(rest)
    elif rest:
        found.append(Section(None, rest))
    return found


def _write_text(path: Path, text: str) -> Path:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
    return path


def _write_csv(path: Path, frame: pd.DataFrame) -> Path:
    atomic_write(path, lambda p: frame.to_csv(p, index=False))
    return path


def report_dir(sweep_dir: Path, paper: str | None) -> Path:
    """Where a report goes: ``DIR/report`` without a paper, ``DIR/report-PAPER`` beside one, so a report made
    for one paper never replaces another's."""
    return sweep_dir / (REPORT_DIR if paper is None else f"{REPORT_DIR}-{paper}")


def write_report(sweep_dir: str | Path, paper: str | None = None) -> Path:
    """Write the report of the sweep in ``sweep_dir`` to :func:`report_dir` and return that directory.

    Args:
        sweep_dir: a directory holding results.parquet and runs/<run_id>/eval/.
        paper: a registered paper ("stopping", "stars", "mechanistic", "recursive") to set our numbers
            beside that paper's.

    Raises:
        LooplabError: unknown ``paper``, or no readable results.parquet.
    """
    sweep_dir = Path(sweep_dir)
    if paper is not None and paper not in PAPERS and (sweep_dir / RESULTS_FILE).is_file():
        load_plugins(sweep_plugins(read_results(sweep_dir)))  # a plugin paper the sweep's runs name
    registered = check_paper(paper) if paper is not None else None  # before anything else is read
    results = read_results(sweep_dir)
    load_plugins(sweep_plugins(results))  # the plugin schedules and tasks the runs name
    grids = load_run_tables(results, sweep_dir, "grid.parquet", ("length", "loops", "accuracy", "flip_rate", "split"))
    depths = load_run_tables(results, sweep_dir, "policy_depths.parquet", ("length", "depth", "count"))
    results = add_scaling_metrics(results, grids)
    ours = sweep_statistics(results)

    tables, notes = our_tables(ours), [provenance(sweep_dir), *method_notes(results)]
    if paper is not None:
        paper_tables, paper_notes = compare(paper, ours)
        tables, notes = tables + paper_tables, notes + paper_notes
    if registered is not None and registered.run_tables is not None:
        tables += registered.run_tables(results, sweep_dir, PAPER_TABLES_DIR)
    title = f"looplab report: {sweep_dir.resolve().name}" + (f" (paper: {paper})" if paper else "")

    out = report_dir(sweep_dir, paper)
    out.mkdir(exist_ok=True)
    written = [_write_csv(out / "table.csv", seed_table("all", ours.groups, ours.long, BY).numbers)]
    written += [_write_csv(out / f"{t.name}.csv", t.numbers) for t in tables if t.name]
    written += [
        _write_text(out / "table.md", to_markdown(tables, title, notes)),
        _write_text(out / "table.tex", to_latex(tables)),
    ]
    per_length = per_length_frame(results)
    depths_trained = train_depths(results)
    figures = [
        path
        for task in sorted(results["task.name"].dropna().unique())
        for path in write_task_plots(out, task, per_length, grids, depths, depths_trained.get(task, {}))
    ]
    own_files = []
    for registered_paper in PAPERS.values():
        if registered_paper.figures is not None:
            own_figures, own_tables = registered_paper.figures(out, results, sweep_dir)
            figures += own_figures
            written += [_write_csv(out / name, frame) for name, frame in own_tables.items()]
        own_files += [out / name for name in registered_paper.files]
    written += figures + [path.with_suffix(".pdf") for path in figures]
    summary = [line for line in notes if line.startswith("Conclusion,")]
    reading = [line for line in notes if not line.startswith("Conclusion,")]
    html_page = to_html(title, [sweep_line(results), *summary], reading, sections(tables, figures))
    written.append(_write_text(out / "report.html", html_page))
    for stale in [*out.glob("*.png"), *out.glob("*.pdf"), *out.glob("paper_*.csv"), *own_files]:
        if stale.exists() and stale not in written:
            stale.unlink()
    return out
