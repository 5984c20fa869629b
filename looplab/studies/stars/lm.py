"""The ``stars-lm`` study in a report: loop-scaling curves and the relative-drop table beside the paper's.

Two parts feed it. From scratch: the sweep's ``kjv_arithmetic`` runs, each with
``eval/lm_loops.csv`` (loss, reasoning_id, reasoning_ood, state_norm,
spectral_radius per loop) and the ``lm.scaling.*`` summary in results.parquet.
Pretrained: ``SWEEP_DIR/retrofit/<recipe>-seed<s>/`` (:mod:`looplab.studies.stars.study`).

The paper's counterpart of a recipe is its GSM8K row (``stars_math.csv``) and
stated relative drop (``stars_facts.csv``): ``fixed`` ↔ Ouro-1.4B-SFT, ``stars`` ↔
Ouro-1.4B-STARS, ``as_is`` ↔ Ouro-1.4B; ``lognormal`` (random loops without JSRR) is
our ablation and has none.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from looplab.io import read_json_object
from looplab.plotting import SCHEDULE_COLORS, pyplot, save_figure
from looplab.report.aggregate import seed_stats
from looplab.report.comparison import read_paper_table
from looplab.report.effect import welch_from_stats
from looplab.report.pages import read_table, register_block
from looplab.report.tables import MISSING, Table, cell, number

LM_TASK = "kjv_arithmetic"
RETROFIT_DIR = "retrofit"
LOOPS_FILE = "lm_loops.csv"
CURVES_FILE = "lm_curves.csv"
PAPER_DEPTH = 4
LM_TABLE_TITLE = "Ours vs paper: loop scaling of a looped LM (STARS)"
#: recipe → (stars_math.csv model, stars_facts.csv relative-drop fact)
PAPER_ROWS = {
    "as_is": ("Ouro-1.4B", "gsm8k_relative_drop_4_to_8_base_pct"),
    "fixed": ("Ouro-1.4B-SFT", "gsm8k_relative_drop_4_to_8_sft_pct"),
    "stars": ("Ouro-1.4B-STARS", "gsm8k_relative_drop_4_to_8_stars_pct"),
}
#: one colour per recipe in every STARS figure; a recipe named after a schedule has that schedule's colour
RECIPE_COLORS = {
    "as_is": "black",
    "fixed": SCHEDULE_COLORS["fixed"],
    "fixed4": SCHEDULE_COLORS["fixed"],
    "lognormal": SCHEDULE_COLORS["lognormal"],
    "stars": "tab:green",
    "fixed4_jsrr": "tab:purple",
    "frobenius": "tab:olive",
    "state_l2": "tab:brown",
    "prelude_coda": "tab:pink",
    "contractive": "tab:cyan",
    "pretrain": "tab:red",
}
#: for any other recipe, by its rank among them: colours no recipe above uses
OTHER_RECIPE_COLORS = ("tab:gray", "goldenrod", "navy", "teal", "maroon")
PANELS = (
    ("reasoning_id", "exact match, train sizes (%)", 100),
    ("reasoning_ood", "exact match, longer chains (%)", 100),
    ("loss", "KJV validation loss (nats)", 1),
    ("state_norm", r"$\|h_t\|$ per token", 1),
)
CAPTIONS = {
    "loopscaling": "Loop scaling of the from-scratch looped LMs: exact match on chain arithmetic (train sizes, "
    "longer chains), KJV validation loss and the state norm against test loops (log axis), one row per core "
    "shape, one line per recipe (mean over seeds, band ± one sample std). Dashed line: the depth every recipe "
    "is read at (4).",
    "retrofitscaling": "Loop scaling of the retrofitted SmolLM2-135M, as is and fine-tuned at a fixed 4 loops or "
    "with STARS: the same panels, mean over seeds.",
}


def split_variant(variant: str) -> tuple[str, str]:
    """("pre_sandwich", "stars") from "pre_sandwich-stars"; the shape is "" for a one-part name."""
    shape, _, recipe = str(variant).split("+", 1)[0].rpartition("-")
    return shape, recipe


def scratch_curves(results: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """Every from-scratch run's lm_loops.csv stacked with its shape, recipe and seed."""
    parts = []
    runs = results[results.get("task.name", pd.Series(dtype=str)) == LM_TASK]
    placements = runs.get("model.placement", pd.Series("", index=runs.index))
    for variant, seed, run_dir, placement in zip(runs["variant"], runs["run.seed"], runs["run_dir"], placements):
        path = sweep_dir / run_dir / "eval" / LOOPS_FILE
        if path.is_file():
            shape, recipe = split_variant(variant)
            if not shape:  # a pretrained run: its variant names its shape
                shape, recipe = str(placement), str(variant)
            parts.append(read_table(path).assign(shape=shape, recipe=recipe, seed=seed))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def retrofit_runs(sweep_dir: Path) -> tuple[pd.DataFrame, list[dict]]:
    """The retrofit part: its loops.csv stacked (shape "SmolLM2-135M retrofit") and its summaries."""
    parts, summaries = [], []
    for summary_path in sorted((sweep_dir / RETROFIT_DIR).glob("*/summary.json")):
        summary = read_json_object(summary_path, "retrofit summary", ("recipe", "seed"))
        summaries.append(summary)
        parts.append(
            read_table(summary_path.parent / "loops.csv").assign(
                shape="SmolLM2-135M retrofit", recipe=summary["recipe"], seed=summary["seed"]
            )
        )
    return (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()), summaries


def plot_curves(curves: pd.DataFrame, path: Path, title: str) -> Path:
    """One row of panels per shape, one line (mean ± std band over seeds) per recipe."""
    plt = pyplot()
    shapes = sorted(curves["shape"].unique())
    fig, axes = plt.subplots(
        len(shapes), len(PANELS), figsize=(4 * len(PANELS), 3.2 * len(shapes)), squeeze=False, layout="constrained"
    )
    for row, shape in zip(axes, shapes):
        mine = curves[curves["shape"] == shape]
        others = sorted(r for r in curves["recipe"].unique() if r not in RECIPE_COLORS)
        for recipe, runs in mine.groupby("recipe", sort=True):
            color = RECIPE_COLORS.get(recipe) or OTHER_RECIPE_COLORS[others.index(recipe) % len(OTHER_RECIPE_COLORS)]
            stats = runs.groupby("loops")[[c for c, _, _ in PANELS if c in runs]].agg(["mean", "std"])
            for axis, (column, ylabel, scale) in zip(row, PANELS):
                if column not in stats or stats[column]["mean"].isna().all():
                    continue
                # one seed has no spread: NaN draws no band rather than a zero-width one
                mean, std = scale * stats[column]["mean"], scale * stats[column]["std"]
                seeds = runs["seed"].nunique()
                axis.plot(stats.index, mean, color=color, label=f"{recipe} ({seeds} seed{'s' * (seeds != 1)})")
                axis.fill_between(stats.index, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
                axis.set(xscale="log", xlabel="loops", ylabel=ylabel)
        for axis, (column, _, _) in zip(row, PANELS):
            axis.axvline(PAPER_DEPTH, color="grey", linestyle="--", linewidth=0.8)
            axis.set_title(f"{shape}" if column == PANELS[0][0] else "")
            low, high = axis.get_ylim()
            if column == "state_norm" and low > 0 and high / low > 10:  # a log axis only where norms span decades
                axis.set_yscale("log")
        handles, labels = row[0].get_legend_handles_labels()
        # beside the row, not inside a panel: with many recipes a legend covers the curves and the labels
        row[-1].legend(
            handles, labels, title="bands: ±1 SD over seeds", loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8
        )
    fig.suptitle(title)
    save_figure(fig, path)
    return path


def _stats(values) -> dict:
    """n, mean, std and the mean's Student-t 95 % interval over the finite values (NaN below 2 seeds)."""
    return seed_stats([v for v in values if v is not None])


def _column(summaries: list[dict], split: str, key: str, scale: float) -> dict:
    """Seed statistics of one summary entry (``split`` = "id" / "ood", ``key`` e.g. "at_depth")."""
    return _stats([scale * s[split][key] for s in summaries if split in s and s[split][key] is not None])


def _paper(recipe: str, tables_dir: Path) -> tuple[str, dict]:
    math_table, _ = read_paper_table("stars_math.csv", tables_dir)
    facts, _ = read_paper_table("stars_facts.csv", tables_dir)
    if recipe not in PAPER_ROWS or math_table is None or facts is None:
        return MISSING, {}
    model, fact = PAPER_ROWS[recipe]
    rows = math_table[math_table["model"] == model].set_index("loops")["gsm8k"]
    stated = facts.loc[facts["fact"] == fact, "value"]
    at4, at8 = (float(rows.get(str(k), "nan")) for k in (4, 8))
    drop = float(stated.iloc[0]) if len(stated) else math.nan
    text = f"{model}: {number(at4, 2)} → {number(at8, 2)}, drop {number(drop, 2)} %"
    return text, {"paper.model": model, "paper.gsm8k_at_4": at4, "paper.gsm8k_at_8": at8, "paper.drop_pct": drop}


def drop_table(runs: list[tuple[str, str, dict]], tables_dir: Path) -> Table:
    """One row per (part, recipe): our ID accuracy at 4 and 8 loops, relative drop, best, beside the paper's.

    ``runs`` holds (part, recipe, scaling summary) per run.
    """
    display, numbers = [], []
    keys = list(dict.fromkeys((part, recipe) for part, recipe, _ in runs))
    for part, recipe in keys:
        mine = [s for p, r, s in runs if (p, r) == (part, recipe)]
        columns = {
            "Acc at 4 (%)": _column(mine, "id", "at_depth", 100),
            "Acc at 8 (%)": _column(mine, "id", "at_twice_depth", 100),
            "Rel. drop 4→8 (%)": _column(mine, "id", "relative_drop", 100),
            "Best (%)": _column(mine, "id", "best", 100),
            "Best at loops": _column(mine, "id", "best_loops", 1),
            "Longer chains, best (%)": _column(mine, "ood", "best", 100),
        }
        paper_text, paper_numbers = _paper(recipe, tables_dir)
        display.append(
            {"Model": part, "Recipe": recipe, "Seeds": str(len(mine))}
            | {name: cell(s, 1) for name, s in columns.items()}
            | {"Paper (GSM8K, 4 → 8 loops)": paper_text}
        )
        numbers.append(
            {"part": part, "recipe": recipe, "runs": len(mine)}
            | {f"{name}.{stat}": s[stat] for name, s in columns.items() for stat in ("n", "mean", "std")}
            | paper_numbers
        )
    return Table(
        LM_TABLE_TITLE,
        pd.DataFrame(display),
        pd.DataFrame(numbers),
        "Ours: exact match on chain-arithmetic problems of the training sizes, read at 4 and 8 loops; "
        "relative drop (acc(4) − acc(8)) / acc(4). Paper: GSM8K from stars_math.csv, the drop as "
        "stars_facts.csv states it. Cells: mean ± std [Student-t 95 % interval] over seeds.",
        "paper_stars_lm",
    )


def stars_lm_tables(results: pd.DataFrame, sweep_dir: Path, tables_dir: Path) -> list[Table]:
    """The relative-drop table, when the sweep holds the study's runs (else nothing)."""
    runs = []
    if "lm.scaling.id.at_depth" in results.columns:
        for variant, row in results[results["task.name"] == LM_TASK].set_index("variant").iterrows():
            shape, recipe = split_variant(variant)
            # a sweep's fine-tunes (stars-finetune) start from a pretrained run; its pretrained runs and
            # stars-lm's runs start from scratch
            tuned = bool(row.get("train.init_from") or "")
            if not shape:  # a pretrained run: its variant names its shape
                shape, recipe = str(row.get("model.placement", "")), str(variant)
            part = f"fine-tuned from fixed 4, {shape}" if tuned else f"from scratch, {shape}"
            runs.append((part, recipe, _summary_from_row(row)))
    runs += [("SmolLM2-135M retrofit", s["recipe"], s) for s in retrofit_runs(sweep_dir)[1]]
    return [drop_table(runs, tables_dir)] if runs else []


def _summary_from_row(row: pd.Series) -> dict:
    """The ``lm.scaling`` part of a results row, nested back as :func:`scaling_summary` wrote it."""
    found: dict = {}
    for split in ("id", "ood"):
        values = {
            key: (None if pd.isna(row.get(f"lm.scaling.{split}.{key}")) else float(row[f"lm.scaling.{split}.{key}"]))
            for key in ("at_depth", "at_twice_depth", "relative_drop", "best", "best_loops")
        }
        if values["best"] is not None:
            found[split] = values
    return found


def curve_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds of every per-loop column, per (shape, recipe, loops): ``lm_curves.csv``."""
    columns = [c for c, _, _ in PANELS if c in curves] + [c for c in ("spectral_radius",) if c in curves]
    table = curves.groupby(["shape", "recipe", "loops"])[columns].agg(["mean", "std"])
    table.columns = [f"{column}.{stat}" for column, stat in table.columns]
    return table.reset_index()


def write_lm_outputs(out: Path, results: pd.DataFrame, sweep_dir: Path) -> tuple[list[Path], dict[str, pd.DataFrame]]:
    """The figures ``kjv_arithmetic-loopscaling.png`` and ``retrofit-retrofitscaling.png``, where their
    runs exist, and the curves of both parts as one table, ``lm_curves.csv`` (none when neither exists)."""
    figures, tables = [], []
    for curves, path, title in (
        (scratch_curves(results, sweep_dir), out / f"{LM_TASK}-loopscaling.png", "looped LMs trained here"),
        (retrofit_runs(sweep_dir)[0], out / "retrofit-retrofitscaling.png", "SmolLM2-135M retrofit"),
    ):
        if not curves.empty:
            figures.append(plot_curves(curves, path, title))
            tables.append(curve_table(curves))
    return figures, ({CURVES_FILE: pd.concat(tables, ignore_index=True)} if tables else {})


# ------------------------------------------------------------------------------ what the data say, generated
# stars-lm has no frozen protocol: these blocks describe the committed seed aggregates (paper_stars_lm.csv,
# lm_curves.csv) with Student-t and Welch intervals from each cell's n, mean and std, and decide nothing.

PAGE_DIR = "stars-lm"
DROP_FILE = "paper_stars_lm.csv"
SCRATCH_SHAPES = ("pre_sandwich", "post_sandwich")
RANDOM_LOOPS = ("lognormal", "stars")


def _cells(results_dir: Path) -> pd.DataFrame:
    return pd.read_csv(Path(results_dir) / PAGE_DIR / DROP_FILE).set_index(["part", "recipe"])


def _t(row: pd.Series, stem: str, digits: int = 1) -> str:
    """ "mean [t-interval]" of one aggregate cell (n, mean, std over seeds)."""
    n, mean, std = (float(row[f"{stem}.{stat}"]) for stat in ("n", "mean", "std"))
    half = float(scipy_stats.t.ppf(0.975, n - 1) * std / np.sqrt(n)) if n > 1 else float("nan")
    return f"{mean:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"


def _welch(a: pd.Series, b: pd.Series, stem: str) -> str:
    """ "a − b [Welch 95 %]" of one aggregate column between two rows."""
    stats = [float(r[f"{stem}.{s}"]) for r in (a, b) for s in ("mean", "std", "n")]
    low, high = welch_from_stats(*stats)
    return f"{stats[0] - stats[3]:+.1f} pp [{low:+.1f}, {high:+.1f}]"


@register_block(f"{PAGE_DIR}/says-scratch")
def says_scratch(results_dir: Path) -> str:
    """From scratch, per core: fixed 4's relative drop and peak; the random-loop recipes'; STARS against
    log-normal loops and against fixed 4 (exploratory: no frozen rule)."""
    cells = _cells(results_dir)
    lines = []
    for shape in SCRATCH_SHAPES:
        rows = {r: cells.loc[(f"from scratch, {shape}", r)] for r in ("fixed", *RANDOM_LOOPS)}
        seeds = int(rows["fixed"]["runs"])
        random = "; ".join(
            f"{r} drop {_t(rows[r], 'Rel. drop 4→8 (%)')} %, best at {rows[r]['Best at loops.mean']:.1f} loops"
            for r in RANDOM_LOOPS
        )
        lines.append(
            f"- {shape}, {seeds} seeds per recipe (mean [Student-t 95 %]): fixed 4 loses "
            f"{_t(rows['fixed'], 'Rel. drop 4→8 (%)')} % of its accuracy from 4 to 8 loops and peaks at "
            f"{rows['fixed']['Best at loops.mean']:.1f} loops; {random}. STARS − lognormal, accuracy at 8 loops "
            f"{_welch(rows['stars'], rows['lognormal'], 'Acc at 8 (%)')}; STARS − fixed 4, best accuracy "
            f"{_welch(rows['stars'], rows['fixed'], 'Best (%)')} (Welch 95 %)."
        )
    return "\n".join(lines)


@register_block(f"{PAGE_DIR}/says-curves")
def says_curves(results_dir: Path) -> str:
    """The curves' seed means by core and recipe: exact match at the deepest read, KJV loss from 4 loops to it,
    the state norm's growth and ρ at 4 loops and at the deepest read."""
    curves = pd.read_csv(Path(results_dir) / PAGE_DIR / CURVES_FILE)
    lines = []
    for shape, part in curves.groupby("shape", sort=False):
        cells = []
        for recipe, runs in part.groupby("recipe", sort=False):
            runs = runs.set_index("loops")
            deepest = int(runs.index.max())
            cells.append(
                f"{recipe}: exact match {100 * runs['reasoning_id.mean'][deepest]:.1f} % at {deepest} loops, KJV loss "
                f"{runs['loss.mean'][PAPER_DEPTH]:.2f} → {runs['loss.mean'][deepest]:.2f}, ‖h_{deepest}‖ / ‖h_1‖ "
                f"{_ratio(runs['state_norm.mean'][deepest] / runs['state_norm.mean'][1])}, ρ "
                f"{runs['spectral_radius.mean'][PAPER_DEPTH]:.2f} at {PAPER_DEPTH} loops and "
                f"{runs['spectral_radius.mean'][deepest]:.2f} at {deepest}"
            )
        lines.append(f"- {shape} (seed means): " + "; ".join(cells) + ".")
    return "\n".join(lines)


def _ratio(value: float) -> str:
    """A growth ratio: three decimals near 1, one beyond 10."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3f}"
