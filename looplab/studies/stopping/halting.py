"""Whether a learned halting policy collapsed: its depth and spread on the training lengths.

A run with a halting head (RL-Halting, PonderNet) records, per evaluated length
n, the mean and the entropy of its halting distribution π(τ | x) over the
evaluated loops. Over the training lengths (``split = id``) we average

    depth / T(n)   the mean halting depth over the task's natural depth T(n)
    entropy        the entropy of π in nats (0: one depth for every input)

Collapse rule, stated before any run was read: a run has collapsed to a
shallow policy when its depth / T(n) is below ``SHALLOW`` = 0.5, i.e. it halts,
on average, before half the loops the task needs.
"""

from __future__ import annotations

import math
import re

import pandas as pd
import torch

from looplab.report.aggregate import numeric
from looplab.report.tables import UNDEFINED, Table, seeds_cell
from looplab.tasks import make_task

SHALLOW = 0.5
_HALTING = re.compile(r"halting\.(\d+)\.mean_depth$")


def halting_metrics(results: pd.DataFrame) -> pd.DataFrame:
    """Per run with a halting head: ``task.name``, ``variant``, ``depth_ratio``, ``entropy``, ``collapsed``,
    ``oracle_ood``; empty when no run has one."""
    lengths = sorted(int(m.group(1)) for c in results.columns if (m := _HALTING.match(c)))
    oracle_ood = numeric(results, "oracle_ood")
    rows = []
    for index, run in results.iterrows():
        task = make_task(run["task.name"], int(run.get("task.alphabet", 8)))
        ratios, entropies = [], []
        for n in lengths:
            depth = run.get(f"halting.{n}.mean_depth")
            if run.get(f"per_length.{n}.split") != "id" or depth is None or not math.isfinite(float(depth)):
                continue
            ratios.append(float(depth) / int(task.steps(torch.tensor([n]))[0]))
            entropies.append(float(run[f"halting.{n}.entropy"]))
        if ratios:
            ratio = sum(ratios) / len(ratios)
            rows.append(
                {
                    "task.name": run["task.name"],
                    "variant": run["variant"],
                    "depth_ratio": ratio,
                    "entropy": sum(entropies) / len(entropies),
                    "collapsed": ratio < SHALLOW,
                    "oracle_ood": float(oracle_ood[index]),
                }
            )
    return pd.DataFrame(rows)


def _cell(values: pd.Series, scale: float = 1.0, decimals: int = 2) -> str:
    values = values.dropna() * scale
    if values.empty:
        return UNDEFINED
    if len(values) == 1:
        return f"{values.iloc[0]:.{decimals}f}"
    return f"{values.mean():.{decimals}f} ± {values.std(ddof=1):.{decimals}f}"


def halting_table(results: pd.DataFrame) -> Table | None:
    """Depth / T(n), entropy, collapsed runs and Oracle OOD per task × halting variant; None without one."""
    runs = halting_metrics(results)
    if runs.empty:
        return None
    display, numbers = [], []
    for (task, variant), rows in runs.groupby(["task.name", "variant"], sort=True):
        collapsed = int(rows["collapsed"].sum())
        display.append(
            {
                "Task": task,
                "Variant": variant,
                "Seeds": seeds_cell(len(rows)),
                "Depth / T(n), ID": _cell(rows["depth_ratio"]),
                "Entropy (nats), ID": _cell(rows["entropy"]),
                "Collapsed": f"{collapsed} / {len(rows)}",
                "Oracle OOD (%)": _cell(rows["oracle_ood"], 100, 1),
            }
        )
        numbers.append(
            {
                "task.name": task,
                "variant": variant,
                "seeds": len(rows),
                "depth_ratio.mean": rows["depth_ratio"].mean(),
                "depth_ratio.std": rows["depth_ratio"].std(ddof=1),
                "entropy.mean": rows["entropy"].mean(),
                "entropy.std": rows["entropy"].std(ddof=1),
                "collapsed": collapsed,
                "oracle_ood_pct.mean": 100 * rows["oracle_ood"].mean(),
                "oracle_ood_pct.std": 100 * rows["oracle_ood"].std(ddof=1),
            }
        )
    return Table(
        "Halting policies on the training lengths",
        pd.DataFrame(display),
        pd.DataFrame(numbers),
        f"Depth / T(n): the halting distribution's mean depth over the task's natural depth, averaged over the "
        f"training lengths; a run has collapsed to a shallow policy when it is below {SHALLOW:g}.",
        "stopping_halting",
    )
