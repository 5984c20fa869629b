"""The SmolLM2-135M retrofit at a budget that learns the task (docs/results/stars-retrofit/PROTOCOL.md):
fixed 4 loops against STARS; per-run rows, learning curves and the page.

Runs are ``DIR/retrofit/<recipe>-seed<s>/`` folders of :mod:`looplab.studies.stars.study` (``loops.csv``,
``curve.csv``, ``summary.json``). Decision rule, stated before the runs: the Welch 95 % t-interval of
drop(fixed) − drop(stars), drop = (acc(4) − acc(8)) / acc(4) on the training sizes, entirely above 0 →
"STARS holds more", below → "fixed holds more", else "not resolved"; below 5 seeds a side the verdict is
"inconclusive (n seeds)" with the interval beside it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.eval.scaling import relative_drop
from looplab.io import read_json_object
from looplab.report.aggregate import FEW_SEEDS, seed_cell
from looplab.report.effect import welch_interval
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.studies.prose import names, said, span
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
            summary = read_json_object(summary_path, "retrofit summary", ("recipe", "seed"))
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


def drop_range(acc_4) -> tuple[float, float]:
    """The values a mean relative drop over runs with these accuracies at 4 loops can take.

    drop = 1 − acc(8) / acc(4) with acc(8) ∈ [0, 1]: at most 1 (nothing left at 8 loops) and at least
    1 − 1 / acc(4) (everything right at 8 loops), so the mean over runs lies in [mean(1 − 1 / acc(4)), 1].
    """
    acc_4 = np.asarray(acc_4, dtype=float)
    return float(np.mean(1 - 1 / acc_4)), 1.0


def _drops(runs: pd.DataFrame, recipe: str) -> tuple[np.ndarray, np.ndarray]:
    """A recipe's relative drops and the accuracies at 4 loops they are relative to (runs with a drop)."""
    part = runs[(runs.recipe == recipe) & runs.drop_4_8.notna()]
    return part.drop_4_8.to_numpy(dtype=float), part.em_4.to_numpy(dtype=float)


def decision_line(runs: pd.DataFrame) -> str:
    """The protocol's decision on drop(fixed) − drop(stars), with its interval and seed counts.

    The verdict reads the Welch interval as frozen; the interval printed is clipped to what the difference
    can take, [low(fixed) − 1, 1 − low(stars)] with each recipe's low end from :func:`drop_range` (the
    range always holds 0, so clipping never changes which side of 0 the interval lies on)."""
    (fixed, fixed_4), (stars, stars_4) = (_drops(runs, r) for r in RECIPES)
    if len(fixed) < 2 or len(stars) < 2:
        return f"relative drop 4 → 8, fixed − stars: n/a ({len(fixed)} and {len(stars)} seeds; needs 2 each)"
    low, high = welch_interval(fixed, stars)
    verdict = "STARS holds more" if low > 0 else "fixed holds more" if high < 0 else "not resolved"
    if min(len(fixed), len(stars)) < FEW_SEEDS:
        verdict = f"inconclusive ({min(len(fixed), len(stars))} seeds; by the interval alone: {verdict})"
    floor, ceiling = drop_range(fixed_4)[0] - 1.0, 1.0 - drop_range(stars_4)[0]
    clipped = max(low, floor), min(high, ceiling)
    note = ""
    if clipped != (low, high):
        whole = "it spans all of that" if clipped == (floor, ceiling) else f"[{100 * floor:+.1f}, {100 * ceiling:+.1f}]"
        note = f"; clipped to what the difference can take given each run's accuracy at 4 loops: {whole}"
    return (
        f"relative drop 4 → 8 loops, fixed − stars: {100 * (fixed.mean() - stars.mean()):+.1f} pp, Welch 95% "
        f"[{100 * clipped[0]:+.1f}, {100 * clipped[1]:+.1f}] ({len(fixed)} vs {len(stars)} seeds{note}): {verdict}"
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
        bounds = drop_range(part.loc[part.drop_4_8.notna(), "em_4"])
        body.append([recipe, str(len(part)), *cells, seed_cell(part.drop_4_8, bounds=bounds)])
    return markdown_table(["recipe", "seeds", "em at 4 (%)", "em at 8 (%)", "em at 16 (%)", "drop 4 → 8 (%)"], body)


# ------------------------------------------------------------------------------ what the data say, generated
# The page's findings as sentences from runs.csv and curves.csv (looplab.studies.prose): the rule's line said,
# the protocol's secondary question (≥ 90 % at 4 loops) counted, and descriptions of the runs; the paper's
# relative drops from stars_facts.csv. The interpretation beside each block is hand-written and marked.

#: the paper's relative drops 4 → 8 loops on GSM8K (stars_facts.csv) beside each recipe
PAPER_DROPS = {"fixed": "gsm8k_relative_drop_4_to_8_sft_pct", "stars": "gsm8k_relative_drop_4_to_8_stars_pct"}
SEARCH = "retrofit-budget"


def paper_drop(recipe: str) -> str:
    """The paper's stated relative drop 4 → 8 loops of the recipe's counterpart, as printed ("n/a" when absent)."""
    from looplab.report.comparison import PAPER_TABLES_DIR, read_paper_table

    facts, _ = read_paper_table("stars_facts.csv", PAPER_TABLES_DIR)
    stated = [] if facts is None else list(facts.loc[facts["fact"] == PAPER_DROPS[recipe], "value"])
    return f"{stated[0]} %" if stated else "n/a (stars_facts.csv lacks it)"


def _run(row) -> str:
    return f"{row.recipe} seed {row.seed}" + (" (the search)" if row.part.startswith(SEARCH) else "")


def _runs_count(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _search(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.part.str.startswith(SEARCH)]


@register_block(f"{STUDY}/says-learned")
def says_learned(results_dir: Path) -> str:
    """The protocol's secondary question, did each run learn the task (≥ 90 % at 4 loops), counted per recipe;
    the curves' first step at ≥ 90 %, and the search's."""
    runs, curves = _read(results_dir)
    compared = _compared(runs)
    counts, each = [], []
    for recipe in RECIPES:
        part = compared[compared.recipe == recipe]
        learned = part[part.em_4 >= LEARNED]
        counts.append(f"{len(learned)} of {len(part)} {recipe} seeds")
        each += [f"{_run(row)} {_pct(row.em_4)} %" for row in part.itertuples()]
    reached = compared[compared.learned_step.notna()]
    first = names(f"{_run(row)} at step {int(row.learned_step)}" for row in reached.itertuples())
    never = names(_run(row) for row in compared[compared.learned_step.isna()].itertuples())
    text = (
        f"**Learned the task at 4 loops (the protocol's ≥ {100 * LEARNED:.0f} % on the training sizes): "
        f"{names(counts)}.** Exact match at 4 loops: {', '.join(each)}. The learning curve (64 held-out "
        f"problems) first reads ≥ {100 * LEARNED:.0f} % for {first}; never for {never}."
    )
    for row in _search(runs).itertuples():
        curve = curves[(curves.part == row.part) & (curves.seed == row.seed)].set_index("step")
        if np.isfinite(row.learned_step):
            at = f" (after {curve.elapsed_s[row.learned_step] / 60:.0f} min)" if row.learned_step in curve.index else ""
            reads = f"first reads ≥ {100 * LEARNED:.0f} % at step {int(row.learned_step)}{at}"
        else:
            reads = f"never reads ≥ {100 * LEARNED:.0f} %"
        text += (
            f" The budget search ({row.recipe}, seed {row.seed}, {int(row.steps)} steps): its curve {reads}; "
            f"exact match at 4 loops after its {int(row.steps)} steps {_pct(row.em_4)} %."
        )
    return text


@register_block(f"{STUDY}/says-kjv")
def says_kjv(results_dir: Path) -> str:
    """KJV validation loss at 4 loops after fine-tuning and at each curve's step 0 (untuned): a description."""
    runs, curves = _read(results_dir)
    start = curves[curves.step == 0].drop_duplicates(["part", "seed"])
    untuned = ", ".join(
        f"{row.kjv_loss:.2f} ({'the search, ' if row.part.startswith(SEARCH) else ''}seed {row.seed})"
        for row in start.sort_values("kjv_loss").itertuples()
    )
    return (
        f"KJV validation loss at 4 loops (nats, a description): after fine-tuning "
        f"{span(_compared(runs).kjv_4, 2)} in the {len(_compared(runs))} compared runs and "
        f"{span(_search(runs).kjv_4, 2)} in the search; untuned, at step 0 of each curve (each seed reads its own "
        f"KJV passages): {untuned}."
    )


def _drop_sentence(row) -> str:
    ems = " → ".join(_pct(getattr(row, f"em_{k}")) for k in (4, 8, 16) if np.isfinite(getattr(row, f"em_{k}")))
    depths = "4, 8 and 16" if np.isfinite(row.em_16) else "4 and 8"
    steps = f", after {int(row.steps)} steps" if row.part.startswith(SEARCH) else ""
    return f"{_run(row)} {_pct(row.drop_4_8)} % ({ems} % at {depths} loops{steps}; ρ at 4 loops {row.rho_4:.3f})"


@register_block(f"{STUDY}/says-drops")
def says_drops(results_dir: Path) -> str:
    """Each recipe's relative drops 4 → 8 loops, the runs that learned the task apart, beside the paper's."""
    runs = _read(results_dir)[0]
    sentences = []
    for recipe in RECIPES:
        part = pd.concat([_compared(runs), _search(runs)])
        part = part[part.recipe == recipe]
        learned, not_learned = part[part.em_4 >= LEARNED], part[part.em_4 < LEARNED]
        text = (
            f"Relative drop 4 → 8 loops, {recipe}, in the {_runs_count(len(learned))} that reached "
            f"{100 * LEARNED:.0f} % at 4 loops: {names(map(_drop_sentence, learned.itertuples()))}"
        )
        if len(not_learned):
            text += (
                f"; in the {_runs_count(len(not_learned))} that did not: "
                f"{names(map(_drop_sentence, not_learned.itertuples()))}"
            )
        sentences.append(f"{text}. The paper's {'SFT' if recipe == 'fixed' else 'STARS'}: {paper_drop(recipe)}.")
    return " ".join(sentences)


@register_block(f"{STUDY}/says-decision")
def says_decision(results_dir: Path) -> str:
    """The frozen rule said as a sentence."""
    return said(decision_line(_compared(_read(results_dir)[0])))


@register_block(f"{STUDY}/says-cost")
def says_cost(results_dir: Path) -> str:
    """Wall time per recipe on one thread (exploratory, a description)."""
    runs = _compared(_read(results_dir)[0])
    minutes = {r: runs.loc[runs.recipe == r, "wall_s"] / 60 for r in RECIPES}
    ratio = minutes["stars"].mean() / minutes["fixed"].mean()
    return (
        f"Wall time on one thread beside one other run (a description): fixed {span(minutes['fixed'], 0)} min, "
        f"stars {span(minutes['stars'], 0)} min per run; a STARS run took {ratio:.1f}× a fixed one."
    )
