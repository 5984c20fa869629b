"""The stopping paper (Learned Stochastic Stopping) beside our sweeps: its main table with each side's
protocol and a conclusion per task, its ablations, its training cost, and the effect test by task.

Our schedule stems map to the paper's schedule and config names; everything else a row needs
(its label, its training depth) comes from the schedule entry (:mod:`looplab.report.variants`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from looplab.report.aggregate import numeric
from looplab.report.comparison import Ours, Pair, compare_table, members, read_paper_table, variant_stem
from looplab.report.effect import EFFECT_RULE, describe, effect
from looplab.report.paper import Paper, register_paper
from looplab.report.tables import Table
from looplab.report.variants import schedule_label
from looplab.studies.stopping.halting import halting_table
from looplab.studies.stopping.protocol import (
    best_k_table,
    paper_cost_ratio,
    paper_front_ratio,
    protocol_lines,
    protocol_table,
    stopping_conclusions,
    with_scale_free_metrics,
)

#: what the paper's ablation configs are, as our runs' schedules: (config, schedule name, the parameters
#: that single it out), the first that a run matches naming it; the paper ran them on one task only
STOPPING_CONFIGS = (
    ("fixed_K20", "fixed", {}),
    ("fixed_window_K20_pm5", "fixed_window", {}),
    ("pondernet_weighted_loss", "pondernet", {}),
    ("multi_depth_average", "multi_depth", {}),
    ("window_n_pm5_single_depth", "window", {}),
    ("matched_K_n", "matched", {}),
    ("rl_halting_ent0", "rl_halting", {"entropy_weight": 0.0}),
    ("rl_halting_ent0.1", "rl_halting", {"entropy_weight": 0.1}),
    ("rl_halting_Tmax5", "rl_halting", {"t_max": 5}),
    ("rl_halting_Tmax10", "rl_halting", {"t_max": 10}),
    ("rl_halting_ent0.001", "rl_halting", {}),
)
STOPPING_ABLATION_TASK = "binary_addition"
#: the configs of the main table (stopping_main.csv, stopping_cost.csv) → its schedule names
STOPPING_MAIN = {
    "fixed_K20": "fixed_K20",
    "matched_K_n": "matched_K_n",
    "window_n_pm5_single_depth": "window_n_pm5",
    "rl_halting_ent0.001": "rl_halting",
}


def paper_config(rows: pd.DataFrame) -> str | None:
    """The paper's config that these result rows (one group: one config, several seeds) are, read from
    their ``schedule.*`` columns (:data:`STOPPING_CONFIGS`), never from the variant's file name; None when
    the paper ran nothing like it."""
    if rows.empty or "schedule.name" not in rows:
        return None
    first = rows.iloc[0]
    for config, schedule, params in STOPPING_CONFIGS:
        if first["schedule.name"] != schedule:
            continue
        values = {key: pd.to_numeric(first.get(f"schedule.{key}"), errors="coerce") for key in params}
        if all(values[key] == value for key, value in params.items()):
            return config
    return None


def stopping_tables(ours: Ours, tables_dir: Path) -> tuple[list[Table], list[str]]:
    """Paper 1: the main table (with each side's protocol and a conclusion per task), the ablations and
    the training cost."""
    ours = with_scale_free_metrics(ours)
    protocol, protocol_notes = read_paper_table("stopping_protocol.csv", tables_dir)
    main = compare_table(
        "Ours vs paper: stopping (main table)",
        "stopping_main.csv",
        ours,
        tables_dir,
        lambda g: {"task": g["task.name"], "schedule": STOPPING_MAIN.get(paper_config(members(ours.results, g)))},
        [
            Pair("Oracle OOD (%)", "oracle_ood_pct", "oracle_ood", place=True),
            Pair("Front@90 / train max", "front90_rel", "front90_rel", place=True),
            Pair("Std (pp)", "std_pp", "oracle_ood", "std", place=True),
            Pair("Gap (pp)", "gap_pp", "gap", place=True),
        ],
        note=" ".join([*protocol_lines(ours.results, protocol), "The protocol table below sets them side by side."]),
        describe=schedule_label,
        derive=lambda paper: paper_front_ratio(paper, protocol),
    )
    protocols = protocol_table(ours.results, protocol) if main[0] else None  # beside a comparison only
    ablation = compare_table(
        f"Ours vs paper: stopping ablations ({STOPPING_ABLATION_TASK})",
        f"stopping_ablation_{STOPPING_ABLATION_TASK}.csv",
        ours,
        tables_dir,
        lambda g: (
            {"config": paper_config(members(ours.results, g))} if g["task.name"] == STOPPING_ABLATION_TASK else None
        ),
        [
            Pair("Oracle OOD (%)", "oracle_ood_pct", "oracle_ood"),
            Pair("Policy OOD (%)", "policy_ood_pct", "policy_ood"),
            Pair("Std (pp)", "std_pp", "oracle_ood", "std"),
            Pair("Note", "note"),
        ],
        describe=schedule_label,
    )
    cost = compare_table(
        "Ours vs paper: training cost",
        "stopping_cost.csv",
        ours,
        tables_dir,
        lambda g: {"schedule": STOPPING_MAIN.get(paper_config(members(ours.results, g)))},
        [
            Pair("Block evals / step", "block_evals_per_step", "training_cost.block_evals"),
            Pair("Block evals / T_train", "block_evals_rel", "block_evals_rel", place=True),
        ],
        describe=schedule_label,
        derive=paper_cost_ratio,
    )
    notes = main[1] + ablation[1] + cost[1] + protocol_notes + stopping_conclusions(ours)
    notes += effect_tests(ours.results)
    extra = [table for table in (best_k_table(ours.results), halting_table(ours.results)) if table is not None]
    return main[0] + ([protocols] if protocols is not None else []) + ablation[0] + cost[0] + extra, notes


def effect_tests(results: pd.DataFrame, reference: str = "fixed", others=("window", "rl_halting")) -> list[str]:
    """Per task and other variant, the stopping paper's effect by EFFECT_RULE (needs ≥ 2 seeds on each side)."""
    lines = []
    if not {"task.name", "variant", "oracle_ood", "gap"} <= set(results.columns):
        return lines
    stems = results["variant"].map(variant_stem)
    for task in sorted(results["task.name"].unique()):
        base = results[(results["task.name"] == task) & (stems == reference)]
        for other in others:
            rows = results[(results["task.name"] == task) & (stems == other)]
            if len(base) < 2 or len(rows) < 2:
                continue
            result = effect(
                numeric(base, "oracle_ood"),
                numeric(rows, "oracle_ood"),
                100 * numeric(base, "gap"),
                100 * numeric(rows, "gap"),
            )
            lines.append(
                f"Effect test, {task}, {reference} vs {other} ({len(base)} and {len(rows)} seeds; {EFFECT_RULE}): "
                f"{describe(result)}."
            )
    return lines


register_paper(Paper("stopping", "Learned Stochastic Stopping", stopping_tables))
