"""Recursive reasoners (docs/results/recursive-small/PROTOCOL.md): the arms by seed, halting on against off,
the protocol's decision rules, and TRM's and HRM's published numbers beside them.

Decision rules, stated in the protocol before any run was read (Policy ID is the primary metric):

    deep supervision   ds_fixed − fixed
    halting rule       act_bce − q_halt, act_bce − rl_halting, act_bce − pondernet, act_bce − ds_fixed
        each a Welch 95 % t-interval of the difference in means: "helps" / "better" above 0,
        "hurts" / "worse" below 0, else "not resolved".
    halting on − off   paired by seed (act_bce, q_halt): 95 % t-interval of the mean difference in ID
        accuracy; "halting costs accuracy" below 0, "halting is free" inside ±2 pp, else "not resolved";
        and the wall-time ratio off / on.

The confirmatory study of the head's gradient (docs/results/recursive-confirm/PROTOCOL.md), the same way:

    detaching the head        act_bce_detached − act_bce, q_halt_detached − q_halt: "helps" / "hurts"
    detached head vs no head  act_bce_detached − ds_fixed, q_halt_detached − ds_fixed: "matches" when the
                              interval lies within ±5 pp, else "better" / "worse" / "not resolved"
    halting on − off          act_bce_detached, as above

The maze study (docs/results/recursive-maze/PROTOCOL.md) applies the first rules to mazes unchanged, and

    TRM's two states          trm − ds_fixed on mazes and on 4×4 Sudoku (there against recursive-small's
                              ds_fixed rows of the same seeds): "better" / "worse" / "not resolved"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import (
    aggregate,
    in_display_units,
    numeric,
    present,
    t_interval,
)
from looplab.report.comparison import Ours, read_paper_table
from looplab.report.effect import comparison_line, points
from looplab.report.paper import Paper, register_paper
from looplab.report.tables import Table, seed_table

PRIMARY = "policy_id"
RECURSIVE_METRICS = (
    "policy_id",
    "policy_ood",
    "oracle_id",
    "oracle_ood",
    "gap",
    "exits.policy.mean_depth",
    "halting_inference.on_id",
    "halting_inference.off_id",
    "halting_inference.on_id_depth",
    "halting_inference.on_seconds",
    "halting_inference.off_seconds",
    "training_cost.row_loops_mean",
)
#: (question, arm, against it, word above 0, word below 0)
COMPARISONS = (
    ("deep supervision at a matched depth", "ds_fixed", "fixed", "helps", "hurts"),
    ("halting rule", "act_bce", "q_halt", "better", "worse"),
    ("halting rule", "act_bce", "rl_halting", "better", "worse"),
    ("halting rule", "act_bce", "pondernet", "better", "worse"),
    ("halting rule", "act_bce", "ds_fixed", "better", "worse"),
)
PAIRED_ARMS = ("act_bce", "q_halt")
#: halting on − off within this many points (both ends of the interval) is "free"
FREE_PP = 2.0
#: the confirmatory study's (docs/results/recursive-confirm/PROTOCOL.md): rule 1, then rule 2, whose
#: interval within ±MATCH_PP points of 0 reads "matches"
CONFIRM_COMPARISONS = (
    ("detaching the head", "act_bce_detached", "act_bce", "helps", "hurts"),
    ("detaching the head", "q_halt_detached", "q_halt", "helps", "hurts"),
)
CONFIRM_MATCHES = (
    ("a detached head against no head", "act_bce_detached", "ds_fixed", "better", "worse"),
    ("a detached head against no head", "q_halt_detached", "ds_fixed", "better", "worse"),
)
CONFIRM_PAIRED = ("act_bce_detached",)
MATCH_PP = 5.0
#: the maze study's rule 4, per task
TRM_COMPARISON = ("TRM's two states at matched core applications", "trm", "ds_fixed", "better", "worse")


def arm_of(results: pd.DataFrame) -> pd.Series:
    """The arm of each run: its variant (the config's name after the task, plus any grid override)."""
    return results["variant"].astype(str)


def _values(results: pd.DataFrame, arm: str, metric: str) -> pd.Series:
    """``metric`` of the arm's runs, indexed by seed, NaN dropped."""
    runs = results[arm_of(results) == arm]
    if metric not in runs.columns:
        return pd.Series(dtype=float)
    values = pd.Series(numeric(runs, metric).to_numpy(), index=runs["run.seed"].to_numpy())
    return values.dropna()


def decision_lines(
    results: pd.DataFrame,
    comparisons=COMPARISONS,
    paired_arms=PAIRED_ARMS,
    matches=(),
) -> list[str]:
    """The protocol's decisions, each with its interval and seed counts (undefined comparisons say why).

    ``comparisons`` read "above" / "below" when the Welch interval excludes 0; ``matches`` read
    "matches" when it lies within ±MATCH_PP points, else as the comparisons; ``paired_arms`` get
    halting on − off.
    """
    lines = []
    for (question, arm, other, above, below), margin in [
        *((c, None) for c in comparisons),
        *((m, MATCH_PP) for m in matches),
    ]:
        a, b = _values(results, arm, PRIMARY), _values(results, other, PRIMARY)
        lines.append(comparison_line(question, arm, other, a, b, "Policy ID", above, below, margin))
    for arm in paired_arms:
        paired = halting_on_off(results, arm)
        if paired is None:
            seeds = _values(results, arm, "halting_inference.on_id").index
            seeds = seeds.intersection(_values(results, arm, "halting_inference.off_id").index)
            lines.append(f"halting on − off, {arm}: n/a ({len(seeds)} paired seeds; needs 2)")
            continue
        lines.append(
            f"halting on − off, {arm}: ID accuracy {points(paired.difference.mean())} pp, paired 95% "
            f"[{points(paired.low)}, {points(paired.high)}] ({len(paired.difference)} seeds): {paired.verdict}; "
            f"mean depth on {paired.depth:.2f} loops; wall time off / on {paired.time_ratio:.2f}x"
        )
    return lines


@dataclass(frozen=True)
class HaltingOnOff:
    """The halting rule's reading of one arm: on − off ID accuracy per paired seed (fractions) and its
    95 % t-interval (clipped to ±1, what a difference of two accuracies can take), the verdict, the mean
    halting-on depth and the wall-time ratio off / on."""

    difference: pd.Series  # indexed by seed
    low: float
    high: float
    verdict: str
    depth: float
    time_ratio: float


def halting_on_off(results: pd.DataFrame, arm: str) -> HaltingOnOff | None:
    """The halting rule on ``arm`` (None below two paired seeds): "halting costs accuracy" when the interval
    lies below 0, "halting is free" when it lies within ±FREE_PP points, else "not resolved"."""
    on = _values(results, arm, "halting_inference.on_id")
    off = _values(results, arm, "halting_inference.off_id")
    seeds = on.index.intersection(off.index)
    if len(seeds) < 2:
        return None
    difference = on[seeds] - off[seeds]
    low, high = np.clip(t_interval(difference.to_numpy()), -1.0, 1.0)
    if high < 0:
        verdict = "halting costs accuracy"
    elif -FREE_PP / 100 <= low and high <= FREE_PP / 100:
        verdict = "halting is free"
    else:
        verdict = "not resolved"
    on_s = _values(results, arm, "halting_inference.on_seconds")[seeds]
    off_s = _values(results, arm, "halting_inference.off_seconds")[seeds]
    depth = _values(results, arm, "halting_inference.on_id_depth")[seeds]
    return HaltingOnOff(difference, float(low), float(high), verdict, float(depth.mean()), off_s.sum() / on_s.sum())


def recursive_tables(ours: Ours, tables_dir: Path) -> tuple[list[Table], list[str]]:
    """The arms by seed, the published numbers (another scale and data), and the decision lines."""
    metrics = present(ours.results, RECURSIVE_METRICS)
    arms = seed_table(
        "Ours: recursive reasoners by arm (halting_inference: on = rows leave when they halt, off = all to T_max)",
        ours.groups,
        in_display_units(aggregate(ours.results, ours.by, metrics)),
        ours.by,
    )
    tables = [Table(arms.title, arms.display, arms.numbers, arms.note, "recursive_arms")]
    published, notes = read_paper_table("recursive_published.csv", tables_dir)
    if published is not None:
        tables.append(
            Table(
                "Published: TRM and HRM (another scale, other data: not comparable number for number)",
                published,
                published,
                "from recursive_published.csv",
                "recursive_published",
            )
        )
    return tables, notes + decision_lines(ours.results)


register_paper(Paper("recursive", "Recursive reasoners: TRM and HRM", recursive_tables))
