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
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import (
    aggregate,
    in_display_units,
    numeric,
    present,
    seed_cell,
    t_interval,
)
from looplab.report.comparison import Ours, read_paper_table, variant_stem
from looplab.report.effect import comparison_line, points
from looplab.report.pages import markdown_table, register_block, register_collector
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


def _arm(results: pd.DataFrame) -> pd.Series:
    """The arm of each run: its variant (the config's name after the task, plus any grid override)."""
    return results["variant"].astype(str)


def _values(results: pd.DataFrame, arm: str, metric: str) -> pd.Series:
    """``metric`` of the arm's runs, indexed by seed, NaN dropped."""
    runs = results[_arm(results) == arm]
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
        on = _values(results, arm, "halting_inference.on_id")
        off = _values(results, arm, "halting_inference.off_id")
        seeds = on.index.intersection(off.index)
        if len(seeds) < 2:
            lines.append(f"halting on − off, {arm}: n/a ({len(seeds)} paired seeds; needs 2)")
            continue
        difference = (on[seeds] - off[seeds]).to_numpy()
        low, high = t_interval(difference)
        if high < 0:
            verdict = "halting costs accuracy"
        elif -FREE_PP / 100 <= low and high <= FREE_PP / 100:
            verdict = "halting is free"
        else:
            verdict = "not resolved"
        on_s = _values(results, arm, "halting_inference.on_seconds")[seeds]
        off_s = _values(results, arm, "halting_inference.off_seconds")[seeds]
        depth = _values(results, arm, "halting_inference.on_id_depth")[seeds]
        lines.append(
            f"halting on − off, {arm}: ID accuracy {points(difference.mean())} pp, paired 95% [{points(low)}, "
            f"{points(high)}] ({len(seeds)} seeds): {verdict}; mean depth on {depth.mean():.2f} loops; "
            f"wall time off / on {off_s.sum() / on_s.sum():.2f}x"
        )
    return lines


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


# ----------------------------------------------------------------------------- the committed results page

STUDY = "recursive-small"
#: runs chosen after reading the study's (docs/results/recursive-small/exploratory-*.toml)
EXPLORATORY = "recursive-small-exploratory"
#: the confirmatory study of the head's gradient (docs/results/recursive-confirm/PROTOCOL.md)
CONFIRM = "recursive-confirm"
RUNS_FILE, HALTING_FILE = "runs.csv", "halting.csv"
#: the per-seed columns of runs.csv: its name → the results.parquet column
RUN_COLUMNS = {
    "policy_id": "policy_id",
    "policy_ood": "policy_ood",
    "oracle_id": "oracle_id",
    "oracle_ood": "oracle_ood",
    "gap": "gap",
    "policy_depth_mean": "exits.policy.mean_depth",
    "on_id": "halting_inference.on_id",
    "off_id": "halting_inference.off_id",
    "on_ood": "halting_inference.on_ood",
    "off_ood": "halting_inference.off_ood",
    "on_id_depth": "halting_inference.on_id_depth",
    "on_ood_depth": "halting_inference.on_ood_depth",
    "on_seconds": "halting_inference.on_seconds",
    "off_seconds": "halting_inference.off_seconds",
    "train_loops_per_row": "training_cost.row_loops_mean",
    "train_block_evals": "training_cost.block_evals",
    "wall_s": "wall_s",
}
#: runs.csv columns only an arm with a halting head has
HEAD_COLUMNS = ("on_id", "off_id", "on_ood", "off_ood", "on_id_depth", "on_ood_depth", "on_seconds", "off_seconds")
ARM_ORDER = ("fixed", "ds_fixed", "act_bce", "act_bce_detached", "q_halt", "q_halt_detached", "rl_halting", "pondernet")


@register_collector(CONFIRM)
@register_collector(EXPLORATORY)
@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """The sweeps' per-seed rows as ``out/runs.csv`` (one per run) and ``out/halting.csv`` (one per run and
    size: Oracle and Policy, and halting on / off where the arm has a head), for the committed page."""
    from looplab.report.runs import read_results

    results = pd.concat([read_results(Path(d)).assign(sweep_dir=str(d)) for d in sweep_dirs], ignore_index=True)
    runs = pd.DataFrame(
        {
            "arm": _arm(results),
            "seed": results["run.seed"].astype(int),
            "run_id": results["run_id"],
            **{name: numeric(results, column) if column in results else np.nan for name, column in RUN_COLUMNS.items()},
        }
    )
    sizes = []
    for (_, run), arm in zip(results.iterrows(), runs["arm"]):
        lengths = sorted({int(c.split(".")[1]) for c in results.columns if c.startswith("per_length.")})
        halting_csv = Path(run["sweep_dir"]) / "runs" / run["run_id"] / "eval" / HALTING_FILE
        halting = pd.read_csv(halting_csv).set_index("length") if halting_csv.is_file() else None
        for n in lengths:
            row = {
                "arm": arm,
                "seed": int(run["run.seed"]),
                "length": n,
                "split": run.get(f"per_length.{n}.split"),
                "oracle": run.get(f"per_length.{n}.oracle"),
                "policy": run.get(f"per_length.{n}.policy"),
                "policy_depth": run.get(f"per_length.{n}.policy_depth"),
            }
            if halting is not None and n in halting.index:
                found = halting.loc[n]
                row.update(
                    {
                        f"{side}_{what}": found[f"{side}_{what}"]
                        for side in ("on", "off")
                        for what in ("accuracy", "seconds")
                    }
                )
                row["on_depth"] = found["on_depth_mean"]
            sizes.append(row)
    runs = runs.sort_values(["arm", "seed"], key=lambda c: c.map(_arm_rank) if c.name == "arm" else c)
    runs = runs.reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / RUNS_FILE, index=False)
    pd.DataFrame(sizes).to_csv(out / HALTING_FILE, index=False)
    return runs


def _arm_rank(arm: str) -> tuple[int, str]:
    """Sort key: the protocol's arms in its order, then any other arm by name."""
    stem = variant_stem(arm)
    return (ARM_ORDER.index(stem) if stem in ARM_ORDER else len(ARM_ORDER), arm)


def _arms(runs: pd.DataFrame) -> list[str]:
    return sorted(set(runs.arm), key=_arm_rank)


def arms_table(results_dir: Path, study: str) -> str:
    """Per arm of the study's runs.csv: Policy and Oracle, halting on / off, depth and training cost
    (mean ± std [t-interval])."""
    runs = pd.read_csv(results_dir / study / RUNS_FILE)
    columns = [
        ("Policy ID (%)", "policy_id", 100, 1),
        ("Oracle ID (%)", "oracle_id", 100, 1),
        ("Policy OOD (%)", "policy_ood", 100, 1),
        ("halting on, ID (%)", "on_id", 100, 1),
        ("halting off, ID (%)", "off_id", 100, 1),
        ("depth on, ID (loops)", "on_id_depth", 1, 2),
        ("training loops / row", "train_loops_per_row", 1, 2),
    ]
    body = []
    for arm in _arms(runs):
        part = runs[runs.arm == arm]
        cells = [
            "n/a (no head)"
            if c in HEAD_COLUMNS and part[c].isna().all()
            else seed_cell(part[c], scale, d, (0.0, 1.0) if scale == 100 else (0.0, np.inf))
            for _, c, scale, d in columns
        ]
        body.append([arm, str(len(part)), *cells])
    return markdown_table(["arm", "seeds", *(title for title, *_ in columns)], body)


@register_block(f"{STUDY}/decisions")
def decisions_block(results_dir: Path) -> str:
    """The protocol's decisions, one line each, from runs.csv."""
    return "\n".join(f"- {line}" for line in decision_lines(_decision_frame(results_dir / STUDY)))


@register_block(f"{CONFIRM}/decisions")
def confirm_decisions_block(results_dir: Path) -> str:
    """The confirmatory protocol's decisions, one line each, from its runs.csv."""
    frame = _decision_frame(results_dir / CONFIRM)
    lines = decision_lines(frame, CONFIRM_COMPARISONS, CONFIRM_PAIRED, CONFIRM_MATCHES)
    return "\n".join(f"- {line}" for line in lines)


def _decision_frame(folder: Path) -> pd.DataFrame:
    """runs.csv in the columns :func:`decision_lines` reads."""
    runs = pd.read_csv(folder / RUNS_FILE)
    return pd.DataFrame(
        {
            "variant": runs["arm"],
            "run.seed": runs["seed"],
            PRIMARY: runs["policy_id"],
            **{
                f"halting_inference.{c}": runs[c]
                for c in ("on_id", "off_id", "on_id_depth", "on_seconds", "off_seconds")
            },
        }
    )


@register_block(f"{STUDY}/by-size")
def by_size_block(results_dir: Path) -> str:
    """Per arm and size: Oracle, Policy and (with a head) halting on / off accuracy and depth, seed means."""
    sizes = pd.read_csv(results_dir / STUDY / HALTING_FILE)
    body = []
    for arm in _arms(sizes):
        for n, part in sizes[sizes.arm == arm].groupby("length"):
            has_head = "on_accuracy" in part and part["on_accuracy"].notna().any()
            body.append(
                [
                    arm,
                    str(n),
                    str(part["split"].iloc[0]),
                    f"{100 * part.oracle.mean():.1f}",
                    f"{100 * part.policy.mean():.1f}",
                    f"{part.policy_depth.mean():.2f}",
                    f"{100 * part.on_accuracy.mean():.1f}" if has_head else "n/a (no head)",
                    f"{100 * part.off_accuracy.mean():.1f}" if has_head else "n/a (no head)",
                    f"{part.on_depth.mean():.2f}" if has_head else "n/a (no head)",
                ]
            )
    header = ["arm", "n (blanks)", "split", "Oracle (%)", "Policy (%)", "policy depth", "on (%)", "off (%)", "on depth"]
    return markdown_table(header, body)


def halting_table(results_dir: Path, study: str) -> str:
    """Per arm of the study's runs.csv with a head: halting on against off in distribution (accuracy,
    depth, wall time), seed means."""
    runs = pd.read_csv(results_dir / study / RUNS_FILE)
    body = []
    for arm in _arms(runs):
        part = runs[runs.arm == arm].dropna(subset=["on_id", "off_id"])
        if part.empty:
            continue
        body.append(
            [
                arm,
                str(len(part)),
                seed_cell(part.on_id),
                seed_cell(part.off_id),
                seed_cell(part.on_id - part.off_id, bounds=(-1.0, 1.0)),
                seed_cell(part.on_id_depth, 1, 2, (0.0, np.inf)),
                f"{part.on_seconds.sum() / len(part):.2f}",
                f"{part.off_seconds.sum() / len(part):.2f}",
                f"{part.off_seconds.sum() / part.on_seconds.sum():.2f}x",
            ]
        )
    header = [
        "arm",
        "seeds",
        "on, ID (%)",
        "off, ID (%)",
        "on − off (pp)",
        "depth on, ID",
        "on (s / run)",
        "off (s / run)",
        "off / on time",
    ]
    return markdown_table(header, body)


#: the tables each study's page shows (its blocks "<study>/arms", "<study>/halting")
STUDY_TABLES = {STUDY: (arms_table, halting_table), EXPLORATORY: (arms_table,), CONFIRM: (arms_table, halting_table)}
for _study, _tables in STUDY_TABLES.items():
    for _table in _tables:
        register_block(f"{_study}/{_table.__name__.removesuffix('_table')}")(partial(_table, study=_study))
