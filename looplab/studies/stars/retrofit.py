"""The SmolLM2-135M retrofit at a budget that learns the task (docs/results/stars-retrofit/PROTOCOL.md):
fixed 4 loops against STARS; per-run rows, learning curves and the page.

Runs are ``DIR/retrofit/<recipe>-seed<s>/`` folders of :mod:`looplab.studies.stars.study` (``loops.csv``,
``curve.csv``, ``summary.json``). Decision rule, stated before the runs: the Welch 95 % t-interval of
drop(fixed) − drop(stars), drop = (acc(4) − acc(8)) / acc(4) on the training sizes, entirely above 0 →
"STARS holds more", below → "fixed holds more", else "not resolved"; below 5 seeds a side the verdict is
"inconclusive (n seeds)" with the interval beside it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.eval.scaling import relative_drop
from looplab.report.aggregate import FEW_SEEDS, seed_cell
from looplab.report.effect import welch_interval
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.studies.stars.study import CURVE_FILE, LOOPS_FILE, first_reaching

STUDY = "stars-retrofit"
READ_LOOPS = (1, 2, 4, 8, 16)
DEPTH = 4
LEARNED = 0.9  # exact match at the training depth that counts as having learned the task
RUNS_FILE, CURVES_FILE = "runs.csv", "curves.csv"
RECIPES = ("fixed", "stars")
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


@register_collector(STUDY)
def collect(study_dirs: list[Path], out: Path) -> pd.DataFrame:
    """``out/runs.csv`` (one row per part, recipe and seed: exact match on the training sizes and on longer
    chains at the read depths, the relative drop 4 → 8, the best depth, KJV loss and ρ at 4 loops, the first
    curve step at ≥ 90 %, wall time) and ``out/curves.csv`` (every learning-curve row). The part is the
    folder's name (``retrofit-learned``: the frozen comparison; ``retrofit-budget-*``: the search)."""
    rows, curves = [], []
    for study_dir in map(Path, study_dirs):
        for folder in sorted((study_dir / "retrofit").glob("*-seed*")):
            summary_path = folder / "summary.json"
            if not summary_path.is_file():
                continue
            summary = json.loads(summary_path.read_text())
            row = {"part": study_dir.name, "recipe": summary["recipe"], "seed": int(summary["seed"])}
            curve = pd.read_csv(folder / CURVE_FILE) if (folder / CURVE_FILE).is_file() else None
            row.update(_run_row(folder, summary, curve))
            rows.append(row)
            if curve is not None:
                curves.append(curve.assign(part=row["part"], recipe=row["recipe"], seed=row["seed"]))
    runs = pd.DataFrame(rows).sort_values(["part", "recipe", "seed"]).reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    runs.round(5).to_csv(out / RUNS_FILE, index=False)
    if curves:
        frame = pd.concat(curves, ignore_index=True)
        columns = ["part", "recipe", "seed", "step", "elapsed_s", "accuracy", "problems", "kjv_loss"]
        frame[columns].sort_values(["part", "recipe", "seed", "step"]).round(5).to_csv(out / CURVES_FILE, index=False)
    return runs


def _run_row(folder: Path, summary: dict, curve: pd.DataFrame | None) -> dict:
    loops = pd.read_csv(folder / LOOPS_FILE).set_index("loops")
    row: dict = {"steps": summary["study"]["steps"], "lr": summary["study"]["lr"]}
    for k in READ_LOOPS:
        row[f"em_{k}"] = float(loops.reasoning_id.get(k, np.nan))
        row[f"em_ood_{k}"] = float(loops.reasoning_ood.get(k, np.nan))
    drop = relative_drop(row["em_4"], row["em_8"])
    row["drop_4_8"] = math.nan if drop is None else drop
    row["best_loops"] = int(loops.reasoning_id.idxmax())
    row["best_em"] = float(loops.reasoning_id.max())
    row["kjv_4"] = float(loops.loss[DEPTH])
    row["rho_4"] = float(loops.spectral_radius[DEPTH])
    row["learned_step"] = first_reaching(curve, LEARNED)[0] if curve is not None else math.nan
    row["wall_s"] = float(summary["wall_s"])
    return row


def decision_line(runs: pd.DataFrame) -> str:
    """The protocol's decision on drop(fixed) − drop(stars), with its interval and seed counts."""
    fixed, stars = (runs.loc[runs.recipe == r, "drop_4_8"].dropna().to_numpy(dtype=float) for r in RECIPES)
    if len(fixed) < 2 or len(stars) < 2:
        return f"relative drop 4 → 8, fixed − stars: n/a ({len(fixed)} and {len(stars)} seeds; needs 2 each)"
    low, high = welch_interval(fixed, stars)
    verdict = "STARS holds more" if low > 0 else "fixed holds more" if high < 0 else "not resolved"
    if min(len(fixed), len(stars)) < FEW_SEEDS:
        verdict = f"inconclusive ({min(len(fixed), len(stars))} seeds; by the interval alone: {verdict})"
    return (
        f"relative drop 4 → 8 loops, fixed − stars: {100 * (fixed.mean() - stars.mean()):+.1f} pp, Welch 95% "
        f"[{100 * low:+.1f}, {100 * high:+.1f}] ({len(fixed)} vs {len(stars)} seeds): {verdict}"
    )


def _read(results_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = results_dir / STUDY
    return pd.read_csv(folder / RUNS_FILE), pd.read_csv(folder / CURVES_FILE)


def _compared(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.part == "retrofit-learned"]


def _pct(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{100 * value:.1f}"


@register_block(f"{STUDY}/search")
def search_block(results_dir: Path) -> str:
    """The budget search's learning curve (exploratory): exact match at 4 loops and KJV loss by step."""
    _, curves = _read(results_dir)
    search = curves[curves.part.str.startswith("retrofit-budget")]
    body = [
        [
            f"{row.part} seed {row.seed}",
            str(int(row.step)),
            f"{row.elapsed_s:.0f}",
            _pct(row.accuracy),
            f"{row.kjv_loss:.2f}",
        ]
        for row in search.itertuples()
    ]
    header = ["run", "step", "seconds", "exact match at 4 loops (%)", "KJV loss at 4 loops"]
    return markdown_table(header, body)


@register_block(f"{STUDY}/decision")
def decision_block(results_dir: Path) -> str:
    """The frozen decision, one line."""
    return f"- {decision_line(_compared(_read(results_dir)[0]))}"


@register_block(f"{STUDY}/runs")
def runs_block(results_dir: Path) -> str:
    """Per run: exact match on the training sizes at the read depths, the drop, the longer chains, ρ, KJV."""
    runs = _compared(_read(results_dir)[0])
    body = []
    for row in runs.itertuples():
        learned = "never" if not np.isfinite(row.learned_step) else str(int(row.learned_step))
        body.append(
            [
                row.recipe,
                str(row.seed),
                *(_pct(getattr(row, f"em_{k}")) for k in READ_LOOPS),
                _pct(row.drop_4_8),
                f"{_pct(row.best_em)} ({row.best_loops})",
                _pct(row.em_ood_4),
                f"{row.rho_4:.3f}",
                f"{row.kjv_4:.2f}",
                learned,
                f"{row.wall_s / 60:.0f}",
            ]
        )
    header = [
        "recipe",
        "seed",
        *(f"em at {k} (%)" for k in READ_LOOPS),
        "drop 4 → 8 (%)",
        "best (loops)",
        "longer chains at 4 (%)",
        "ρ at 4",
        "KJV loss at 4",
        "≥ 90 % from step",
        "minutes",
    ]
    return markdown_table(header, body)


@register_block(f"{STUDY}/means")
def means_block(results_dir: Path) -> str:
    """Per recipe: mean ± std [t-interval] over seeds of the read depths and the drop."""
    runs = _compared(_read(results_dir)[0])
    body = []
    for recipe in RECIPES:
        part = runs[runs.recipe == recipe]
        cells = [seed_cell(part[f"em_{k}"]) for k in (4, 8, 16)]
        body.append([recipe, str(len(part)), *cells, seed_cell(part.drop_4_8, bounds=(-np.inf, 1.0))])
    return markdown_table(["recipe", "seeds", "em at 4 (%)", "em at 8 (%)", "em at 16 (%)", "drop 4 → 8 (%)"], body)
