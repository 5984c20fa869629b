"""What the stopping comparison says besides the numbers: each side's protocol, what our variants are,
scale-free ratios, and a conclusion per task from a stated rule.

    Front@90 / train max     our Front@90 over our longest training length; the paper's over 19
    Block evals / T_train    block evaluations per step over the largest depth the schedule trains at
                             (ours from its parameters; the paper's T_train = 20)

Conclusion: per task and variant against fixed, the verdict of the effect test
(:mod:`looplab.report.effect`), the one rule the report decides by.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from looplab.report.aggregate import aggregate, in_display_units, numeric
from looplab.report.comparison import Ours, paper_value, variant_stem
from looplab.report.effect import EFFECT_RULE, effect
from looplab.report.tables import Table, seeds_cell
from looplab.report.variants import training_depth

SCALE_FREE = ("front90_rel", "block_evals_rel")


def with_scale_free_metrics(ours: Ours) -> Ours:
    """``ours`` with Front@90 / train max and block evaluations / T_train per run, aggregated."""
    results = ours.results.copy()
    if "front90" in results:
        results["front90_rel"] = numeric(results, "front90") / numeric(results, "task.train_max")
    if "training_cost.block_evals" in results and "schedule.name" in results:
        depth = results.apply(training_depth, axis=1)
        results["block_evals_rel"] = numeric(results, "training_cost.block_evals") / depth
    added = [m for m in SCALE_FREE if m in results]
    if not added:
        return ours
    long = pd.concat([ours.long, in_display_units(aggregate(results, ours.by, added))], ignore_index=True)
    return Ours(results, ours.groups, long, ours.by)


def paper_front_ratio(paper: pd.DataFrame, protocol: pd.DataFrame | None) -> pd.DataFrame:
    """The paper's main table with Front@90 / its longest training length per task (empty without a protocol)."""
    longest = {} if protocol is None else dict(zip(protocol["task"], protocol["train_max"].map(paper_value)))
    paper = paper.copy()
    if "front90" not in paper:
        paper["front90_rel"] = ""
        return paper
    paper["front90_rel"] = [
        f"{paper_value(front) / longest[task]:.2f}" if task in longest and isinstance(paper_value(front), float) else ""
        for task, front in zip(paper["task"], paper["front90"])
    ]
    return paper


def paper_cost_ratio(paper: pd.DataFrame) -> pd.DataFrame:
    """The paper's cost table with block evaluations / T_train."""
    if not {"block_evals_per_step", "T_train"} <= set(paper.columns):
        return paper
    paper = paper.copy()
    paper["block_evals_rel"] = [
        f"{paper_value(evals) / paper_value(depth):.2f}"
        for evals, depth in zip(paper["block_evals_per_step"], paper["T_train"])
    ]
    return paper


def protocol_lines(results: pd.DataFrame, protocol: pd.DataFrame | None) -> list[str]:
    """One sentence per task: our protocol, then the paper's."""
    lines = []
    for task, rows in results.groupby("task.name", sort=True):
        longest = numeric(rows, "task.train_max").max()
        evaluated = max(max(json.loads(v)) for v in rows["task.eval_lengths"]) if "task.eval_lengths" in rows else None
        ours = (
            f"train n ∈ [{_values(rows, 'task.train_min')}, {_values(rows, 'task.train_max')}], "
            + (
                f"evaluated to n = {evaluated} ({evaluated / longest:.1f}× the longest training length), "
                if evaluated
                else ""
            )
            + f"{_values(rows, 'train.steps')} steps, {_span(rows.groupby('variant').size())} seeds per variant, "
            f"d_model {_values(rows, 'model.d_model')}, {_values(rows, 'model.core_layers')} core layers, "
            f"{_values(rows, 'model.injection')} injection, {_values(rows, 'model.positional')} positions, "
            f"causal {_values(rows, 'model.causal')}"
        )
        line = f"Protocol, {task} — ours: {ours}"
        paper = None if protocol is None else protocol[protocol["task"] == task]
        if paper is not None and not paper.empty:
            p = paper.iloc[0]
            line += (
                f"; paper: train n ∈ [{p['train_min']}, {p['train_max']}], OOD n ∈ [{p['ood_min']}, {p['ood_max']}] "
                f"({paper_value(p['ood_max']) / paper_value(p['train_max']):.1f}×), T_train {p['train_depth']}, "
                f"{p['steps']} steps, {p['seeds']} seeds, width {p['width']}, {p['core_layers']} core layers, "
                f"{p['injection']} injection"
            )
        lines.append(line + ".")
    return lines


#: (setting, our result column or how to read it, the paper protocol's column)
PROTOCOL_SETTINGS = (
    ("train lengths", "train_lengths", "train_lengths"),
    ("longest evaluated length", "longest_length", "ood_max"),
    ("training depth", "training_depth", "train_depth"),
    ("test depth (loops unrolled)", "eval.max_loops", "test_depth"),
    ("training steps", "train.steps", "steps"),
    ("batch size", "train.batch_size", "batch_size"),
    ("learning rate", "train.lr", "lr"),
    ("seeds per variant", "seeds", "seeds"),
    ("width (d_model)", "model.d_model", "width"),
    ("core layers", "model.core_layers", "core_layers"),
    ("attention window", "model.attention_window", None),
    ("injection", "model.injection", "injection"),
    ("positions", "model.positional", None),
    ("causal", "model.causal", None),
)
COMPARABILITY = (
    "Where the protocols differ in steps, lengths or width, absolute accuracies are not comparable between "
    "the two sides: what carries the comparison is the scale-free columns (Front@90 over the longest "
    "training length, block evaluations over the training depth) and each variant's verdict against fixed."
)


def protocol_table(results: pd.DataFrame, protocol: pd.DataFrame | None) -> Table | None:
    """Every setting of each task's protocol, ours beside the paper's, and whether they agree."""
    rows = []
    for task, runs in results.groupby("task.name", sort=True):
        paper = None if protocol is None else protocol[protocol["task"] == task]
        published = paper.iloc[0] if paper is not None and not paper.empty else None
        for setting, ours_column, paper_column in PROTOCOL_SETTINGS:
            ours = _our_setting(runs, ours_column)
            theirs = _paper_setting(published, paper_column)
            rows.append({"Task": task, "Setting": setting, "Ours": ours, "Paper": theirs, "Same": _same(ours, theirs)})
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    return Table("Protocol: ours vs paper", frame, frame, COMPARABILITY, "protocol")


def _our_setting(runs: pd.DataFrame, column: str) -> str:
    if column == "train_lengths":
        return f"[{_values(runs, 'task.train_min')}, {_values(runs, 'task.train_max')}]"
    if column == "longest_length":
        if "task.eval_lengths" not in runs:
            return "?"
        return str(max(max(json.loads(v)) for v in runs["task.eval_lengths"]))
    if column == "training_depth":
        depths = sorted({f"{d:g}" for d in runs.apply(training_depth, axis=1) if np.isfinite(d)})
        return " / ".join(depths) or "?"
    if column == "seeds":
        return _span(runs.groupby("variant").size())
    return _values(runs, column)


def _paper_setting(published: pd.Series | None, column: str | None) -> str:
    if published is None or column is None:
        return "–"
    if column == "train_lengths":
        return f"[{published['train_min']}, {published['train_max']}]"
    return str(published.get(column, "–"))


def _same(ours: str, theirs: str) -> str:
    """ "yes" / "no" when both sides state a value ("–" otherwise); numbers compare as numbers."""
    if theirs in ("–", "not stated") or "?" in ours:
        return "–"
    try:
        return "yes" if float(ours) == float(theirs) else "no"
    except ValueError:
        return "yes" if ours == theirs else "no"


def _values(rows: pd.DataFrame, column: str) -> str:
    """The column's distinct values, "a / b"; "?" when the results do not record it."""
    if column not in rows:
        return "?"
    return " / ".join(sorted(rows[column].astype(str).unique()))


def _span(counts: pd.Series) -> str:
    low, high = int(counts.min()), int(counts.max())
    return str(low) if low == high else f"{low}–{high}"


def stopping_conclusions(ours: Ours, reference: str = "fixed") -> list[str]:
    """Per task, the report's one decision: the effect test's verdict (EFFECT_RULE) for every other variant
    against ``reference``; "inconclusive" below FEW_SEEDS seeds on either side."""
    results = ours.results
    if not {"task.name", "variant", "oracle_ood", "gap"} <= set(results.columns):
        return []
    stems = results["variant"].map(variant_stem)
    lines = []
    for task in sorted(results["task.name"].unique()):
        mine = results["task.name"] == task
        base = results[mine & (stems == reference)]
        if base.empty:
            continue
        verdicts = []
        for stem in sorted(set(stems[mine]) - {reference}):
            rows = results[mine & (stems == stem)]
            result = effect(
                numeric(base, "oracle_ood"),
                numeric(rows, "oracle_ood"),
                100 * numeric(base, "gap"),
                100 * numeric(rows, "gap"),
            )
            verdicts.append(f"{stem} {result.verdict}")
        lines.append(f"Conclusion, {task}, against {reference} ({EFFECT_RULE}): " + "; ".join(verdicts) + ".")
    return lines


def best_k_table(results: pd.DataFrame) -> Table | None:
    """Best K per evaluated length (the smallest K reaching Oracle(n)), mean ± std over seeds, per task × variant."""
    columns = sorted(
        (c for c in results.columns if c.startswith("per_length.") and c.endswith(".best_k")),
        key=lambda c: int(c.split(".")[1]),
    )
    if not columns or not {"task.name", "variant"} <= set(results.columns):
        return None
    display, numbers = [], []
    for (task, variant), rows in results.groupby(["task.name", "variant"], sort=True):
        shown, values = (
            {"Task": task, "Variant": variant, "Seeds": seeds_cell(len(rows))},
            {"task.name": task, "variant": variant},
        )
        for column in columns:
            n, found = column.split(".")[1], numeric(rows, column).dropna()
            mean = float(found.mean()) if len(found) else math.nan
            spread = float(found.std(ddof=1)) if len(found) > 1 else math.nan
            shown[f"n = {n}"] = (
                "–" if not len(found) else (f"{mean:.1f}" + (f" ± {spread:.1f}" if len(found) > 1 else ""))
            )
            values[f"best_k.{n}.mean"], values[f"best_k.{n}.std"] = mean, spread
        display.append(shown)
        numbers.append(values)
    return Table(
        "Best K per length (mean ± std over seeds)",
        pd.DataFrame(display),
        pd.DataFrame(numbers),
        "Best K: the smallest number of loops at which a run reaches its Oracle(n).",
        "stopping_best_k",
    )
