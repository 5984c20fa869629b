"""Tables of seed statistics, each in two forms: cells for people and numbers for machines.

A display cell reads ``mean ± std [lo, hi]`` (see :mod:`looplab.report.aggregate`
for the statistics) in display units: percent for accuracies and rates,
percentage points for Gap and for the std of a percent metric, all four numbers
with the metric's :func:`decimals`. A missing value is "–"; a single seed shows
its value alone (no spread, no interval).

The numeric form has one column per (metric, statistic), named
``<metric><unit suffix>.<stat>`` — ``oracle_ood_pct.mean``, ``gap_pp.std``,
``front90.ci_lo`` — so a CSV column says its own unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from looplab.report.aggregate import FEW_SEEDS, STATS, unit

KEY_HEADERS = {
    "task.name": "Task",
    "variant": "Variant",
    "model.placement": "Placement",
    "model.injection": "Injection",
}
METRIC_HEADERS = {
    "oracle_id": "Oracle ID",
    "oracle_ood": "Oracle OOD",
    "policy_ood": "Policy OOD",
    "gap": "Gap",
    "front90": "Front@90",
    "flip_rate": "Flip rate",
    "training_cost.block_evals": "Block evals / step",
    "front90_rel": "Front@90 / train max",
    "block_evals_rel": "Block evals / T_train",
    "scaling_peak": "Peak accuracy",
    "scaling_peak_loops": "Peak at loops",
    "relative_drop": "Rel. drop peak→last",
    "relative_drop_4_to_8": "Rel. drop 4→8 loops",
    "accuracy_min_4_to_100": "Min accuracy, loops 4–100",
    "nonfinite_last": "Non-finite at last loop",
    "lm.loss_at_training_depth": "Loss at training depth",
    "lm.bits_per_byte_at_training_depth": "Bits/byte at training depth",
    "lm.best_loss": "Best loss",
    "lm.best_loops": "Best loss at loops",
    "lm.loss_at_max_loops": "Loss at max loops",
    "lm.scaling.id.at_depth": "Reasoning at depth",
    "lm.scaling.id.at_twice_depth": "Reasoning at 2x depth",
    "lm.scaling.id.relative_drop": "Reasoning drop depth→2x",
    "lm.scaling.id.best": "Best reasoning",
    "lm.scaling.id.best_loops": "Best reasoning at loops",
    "lm.scaling.ood.best": "Best reasoning, longer chains",
    "lm.scaling.loss.relative_drop": "Loss growth depth→2x",
    "lm.scaling.state_norm_growth": "State norm T / 1",
    "lm.scaling.spectral_radius_at_max_loops": "ρ at max loops",
    "policy_id": "Policy ID",
    "exits.policy.mean_depth": "Policy depth",
    "halting_inference.on_id": "Halting on, ID",
    "halting_inference.off_id": "Halting off, ID",
    "halting_inference.on_id_depth": "Depth on, ID",
    "halting_inference.on_seconds": "Time on (s)",
    "halting_inference.off_seconds": "Time off (s)",
    "training_cost.row_loops_mean": "Training loops / row",
}
_SUFFIX = {"%": "_pct", "pp": "_pp", "": ""}
# lengths and loop counts (means of integers) and the paper's two-decimal training cost
PLAIN_DECIMALS = {
    "front90": 1,
    "scaling_peak_loops": 1,
    "lm.best_loops": 1,
    "lm.scaling.id.best_loops": 1,
    "lm.scaling.state_norm_growth": 2,
    "training_cost.block_evals": 2,
    "training_cost.row_loops_mean": 2,
    "exits.policy.mean_depth": 2,
    "halting_inference.on_id_depth": 2,
    "halting_inference.on_seconds": 2,
    "halting_inference.off_seconds": 2,
    "front90_rel": 2,
    "block_evals_rel": 2,
}
MISSING = "–"  # a value the source does not give (a paper that does not report it)
UNDEFINED = "n/a (0 seeds)"  # a metric no seed defines: undefined, never 0


@dataclass
class Table:
    """A titled table: ``display`` holds strings (Markdown, LaTeX, HTML), ``numbers`` the CSV form.

    ``name`` is the stem of the table's own CSV file, "" for a table whose numbers are in table.csv.
    """

    title: str
    display: pd.DataFrame
    numbers: pd.DataFrame
    note: str = ""
    name: str = ""


def header(metric: str) -> str:
    """Column title for a metric, with its display unit: "Oracle OOD (%)", "Front@90"."""
    name = METRIC_HEADERS.get(metric, metric.removeprefix("analysis."))
    return f"{name} ({unit(metric)})" if unit(metric) else name


def label(metric: str) -> str:
    """CSV column stem for a metric: its name plus the unit suffix (``oracle_ood_pct``, ``gap_pp``)."""
    return metric + _SUFFIX[unit(metric)]


def decimals(metric: str) -> int:
    """Digits after the point: 1 for percent and pp, PLAIN_DECIMALS or 3 (cosines, ratios) otherwise."""
    return 1 if unit(metric) else PLAIN_DECIMALS.get(metric, 3)


def number(value, digits: int) -> str:
    """``value`` with ``digits`` decimals; "–" when missing; text (a paper's "<0.65") as it is."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}f}"


def cell(stats: Mapping, digits: int, runs: int | None = None) -> str:
    """ "mean ± std [lo, hi]" from a row with n, mean, std and the mean's interval ci_lo, ci_hi (display units);
    "n/a (0 seeds)" when no seed defines the metric, "(all n seeds equal)" for a zero spread, and
    "(n = k of runs)" when only some seeds define it."""
    if stats["n"] == 0:
        return UNDEFINED
    text = number(stats["mean"], digits)
    if stats["n"] > 1 and stats["std"] == 0:  # a zero spread has no interval to show: say so
        text += f" (all {stats['n']} seeds equal)"
    elif math.isfinite(stats["std"]):
        text += f" ± {number(stats['std'], digits)}"
    if stats["n"] > 1 and stats["std"] != 0:
        text += f" [{number(stats['ci_lo'], digits)}, {number(stats['ci_hi'], digits)}]"
    if runs is not None and stats["n"] < runs:
        text += f" (n = {stats['n']} of {runs})"
    return text


def interval_cell(stats: Mapping, digits: int) -> str:
    """ "mean [lo, hi]": :func:`cell` without the std, for a cell that holds a paper value beside it."""
    if stats["n"] == 0:
        return UNDEFINED
    text = number(stats["mean"], digits)
    if stats["n"] > 1 and stats["std"] == 0:
        return text + f" (all {stats['n']} seeds equal)"
    if stats["n"] > 1:
        text += f" [{number(stats['ci_lo'], digits)}, {number(stats['ci_hi'], digits)}]"
    return text


def std_cell(stats: Mapping, digits: int) -> str:
    """ "std [lo, hi]": the sample std and its bootstrap interval (display units)."""
    if not math.isfinite(stats["std"]):
        return MISSING
    text = number(stats["std"], digits)
    if math.isfinite(stats["std_lo"]):
        text += f" [{number(stats['std_lo'], digits)}, {number(stats['std_hi'], digits)}]"
    return text


def seeds_cell(runs: int) -> str:
    """The seed count, flagged "(few)" below FEW_SEEDS: the intervals of such a row are rough."""
    return f"{runs} (few)" if runs < FEW_SEEDS else str(runs)


def key_cells(by: list[str], key: tuple) -> dict[str, str]:
    """Display cells of a group key, titled by KEY_HEADERS."""
    return {
        KEY_HEADERS.get(column, column): MISSING if pd.isna(value) else str(value) for column, value in zip(by, key)
    }


def group_key(key) -> tuple[str, ...]:
    """A group key that compares equal across groupbys, missing values included (NaN ≠ NaN)."""
    return tuple(map(str, key if isinstance(key, tuple) else (key,)))


def stats_by_group(long: pd.DataFrame, by: list[str]) -> dict[tuple[str, ...], pd.DataFrame]:
    """``long``'s statistics per :func:`group_key`, each indexed by metric."""
    return {group_key(key): part.set_index("metric") for key, part in long.groupby(by, dropna=False, sort=False)}


def metric_stats(found: pd.DataFrame | None, metric: str) -> Mapping:
    """One metric's n, mean, std, ci_lo, ci_hi from a :func:`stats_by_group` entry (n = 0 if absent)."""
    if found is not None and metric in found.index:
        return found.loc[metric]
    return {"n": 0, **{stat: math.nan for stat in STATS[1:]}}


def seed_table(title: str, groups: pd.DataFrame, long: pd.DataFrame, by: list[str], note: str = "") -> Table:
    """One row per group, one column per metric of ``long``.

    Args:
        groups: ``by``..., ``runs`` and perhaps ``diverged``, one row per group (:func:`aggregate.group_sizes`).
        long: ``by``..., metric, n, mean, std, ci_lo, ci_hi — in display units.
    """
    metrics = list(dict.fromkeys(long["metric"]))
    stats = stats_by_group(long, by)
    display, numbers = [], []
    for _, row in groups.iterrows():
        key = tuple(row[by])
        found = stats.get(group_key(key))
        shown = {**key_cells(by, key), "Seeds": seeds_cell(row["runs"])}
        values = {**dict(zip(by, key)), "runs": row["runs"]}
        if "diverged" in groups.columns:
            shown["Diverged"] = str(row["diverged"])
            values["diverged"] = row["diverged"]
        for metric in metrics:
            s = metric_stats(found, metric)
            shown[header(metric)] = cell(s, decimals(metric), int(row["runs"]))
            values.update({f"{label(metric)}.{stat}": s[stat] for stat in STATS})
        display.append(shown)
        numbers.append(values)
    return Table(title, pd.DataFrame(display), pd.DataFrame(numbers), note)
