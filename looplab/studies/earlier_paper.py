"""The earlier pages beside their papers: "Ours vs paper" blocks computed from the seed aggregates committed
beside them (``<metric>.n``, ``.mean``, ``.std``, ``.digits`` per variant) and the paper CSVs shipped in
``looplab/data/paper_tables``, printed as the paper printed them: stopping-small-binary_addition's three
tables against the stopping paper, mechanistic-small's fixed points by norm placement and injection, and
stars-small's STARS facts.

Those aggregates have one row per variant and no schedule parameters, so a variant is matched to its paper
row by its name, which is the schedule it ran (``configs/stopping-small/<task>-<schedule>.toml`` at the
schedule's defaults): :func:`paper_config` reads it as a run's ``schedule.name``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from looplab.report.comparison import PAPER_TABLES_DIR, read_paper_table
from looplab.report.pages import markdown_table, register_block
from looplab.report.tables import MISSING
from looplab.report.tables import header as metric_header
from looplab.studies.earlier import _read, _seeds, _t_cell, value_range
from looplab.studies.mechanistic.paper import MECHANISTIC_JUDGED, MECHANISTIC_NORMS, mechanistic_verdict
from looplab.studies.stars.paper import STARS_FACTS
from looplab.studies.stopping.paper import STOPPING_MAIN
from looplab.studies.stopping.paper import paper_config as config_of_rows

#: the task stars-small ran (every STARS fact's analogue there is read on it)
STARS_SMALL_TASK = "decimal_addition"
#: the study behind docs/results/stopping-small-binary_addition.md, and the one task it ran
STOPPING_SMALL_STUDY, STOPPING_SMALL_TASK = "stopping-small-binary_addition", "binary_addition"


def mean_std(row: pd.Series, stem: str) -> str:
    """ "mean ± std" of a seed aggregate, at the digits its cells were printed with."""
    digits = int(row[f"{stem}.digits"])
    return f"{row[f'{stem}.mean']:.{digits}f} ± {row[f'{stem}.std']:.{digits}f}"


def std_of(row: pd.Series, stem: str) -> str:
    """The seeds' std of a percent metric (the paper's Std, pp), at its cells' digits."""
    return f"{row[f'{stem}.std']:.{int(row[f'{stem}.digits'])}f}"


def paper_config(variant: str) -> str | None:
    """The stopping paper's config a variant of these aggregates is: its name read as the run's schedule
    (:func:`looplab.studies.stopping.paper.paper_config`); None when the paper ran nothing like it."""
    return config_of_rows(pd.DataFrame({"schedule.name": [variant]}))


@dataclass(frozen=True)
class Side:
    """One compared measure: its header, our cell from a variant's aggregate row (None: the paper's column
    alone) and the paper's column printed beside it (None: ours alone)."""

    name: str
    cell: Callable[[pd.Series], str] | None
    paper: str | None


def stopping_side_by_side(
    results_dir: Path, file: str, key: Callable[[str], dict | None], sides: list[Side], shown_key: str
) -> str:
    """One row per variant of ``stopping-small-binary_addition/cells.csv`` with a row in the paper's ``file``:
    the task, variant, seeds, the paper row (``shown_key``'s paper columns, " / "-joined), then per side our
    cell and the paper's printed value. ``key`` maps a variant to the paper columns that identify its row."""
    paper, notes = read_paper_table(file, PAPER_TABLES_DIR)
    if paper is None:
        return "\n".join(notes)
    cells = _read(results_dir, f"{STOPPING_SMALL_STUDY}/cells.csv")
    body = []
    for _, row in cells.iterrows():
        wanted = key(str(row["variant"]))
        if wanted is None or any(value is None for value in wanted.values()):
            continue
        match = paper
        for column, value in wanted.items():
            match = match[match[column] == value]
        if match.empty:
            continue
        printed = match.iloc[0]
        line = [STOPPING_SMALL_TASK, str(row["variant"]), _seeds(row["Oracle OOD (%).n"])]
        line.append(" / ".join(str(wanted[c]) for c in shown_key.split("/")))
        for side in sides:
            if side.cell is not None:
                line.append(side.cell(row))
            if side.paper is not None:
                line.append(printed[side.paper] or MISSING)
        body.append(line)
    header = ["Task", "Variant", "Seeds", "Paper row"]
    for side in sides:
        header += [f"{side.name} ours"] if side.cell is not None else []
        header += [f"{side.name} paper"] if side.paper is not None else []
    return markdown_table(header, body)


def _mean(stem: str) -> Callable[[pd.Series], str]:
    return lambda row: mean_std(row, stem)


@register_block(f"{STOPPING_SMALL_STUDY}/vs-paper-main")
def _stopping_main(results_dir: Path) -> str:
    """Our variants beside the paper's main table (stopping_main.csv), by (task, schedule)."""
    return stopping_side_by_side(
        results_dir,
        "stopping_main.csv",
        lambda variant: {"task": STOPPING_SMALL_TASK, "schedule": STOPPING_MAIN.get(paper_config(variant))},
        [
            Side("Oracle OOD (%)", _mean("Oracle OOD (%)"), "oracle_ood_pct"),
            Side("Front@90", _mean("Front@90"), "front90"),
            Side("Std (pp)", lambda row: std_of(row, "Oracle OOD (%)"), "std_pp"),
            Side("Gap (pp)", _mean("Gap (pp)"), "gap_pp"),
        ],
        "task/schedule",
    )


@register_block(f"{STOPPING_SMALL_STUDY}/vs-paper-ablation")
def _stopping_ablation(results_dir: Path) -> str:
    """Our variants beside the paper's ablations on binary addition, by config."""
    return stopping_side_by_side(
        results_dir,
        f"stopping_ablation_{STOPPING_SMALL_TASK}.csv",
        lambda variant: {"config": paper_config(variant)},
        [
            Side("Oracle OOD (%)", _mean("Oracle OOD (%)"), "oracle_ood_pct"),
            Side("Policy OOD (%)", _mean("Policy OOD (%)"), "policy_ood_pct"),
            Side("Std (pp)", lambda row: std_of(row, "Oracle OOD (%)"), "std_pp"),
            Side("Note", None, "note"),
        ],
        "config",
    )


@register_block(f"{STOPPING_SMALL_STUDY}/vs-paper-cost")
def _stopping_cost(results_dir: Path) -> str:
    """Our block evaluations per training step beside the paper's (stopping_cost.csv), by schedule."""
    return stopping_side_by_side(
        results_dir,
        "stopping_cost.csv",
        lambda variant: {"schedule": STOPPING_MAIN.get(paper_config(variant))},
        [Side("Block evals / step", _mean("Block evals / step"), "block_evals_per_step")],
        "schedule",
    )


@register_block("mechanistic-small/vs-paper")
def _mechanistic_vs_paper(results_dir: Path) -> str:
    """The norm-ablation rows beside the paper's, with the comparison's verdict (:func:`mechanistic_verdict`)
    recomputed from the seed means in cells.csv (mean ± std over seeds)."""
    cells = _read(results_dir, "mechanistic-small/cells.csv")
    paper, _ = read_paper_table("mechanistic_norm_ablation.csv", PAPER_TABLES_DIR)
    judged = dict(zip(MECHANISTIC_JUDGED.values(), MECHANISTIC_JUDGED))  # ours → paper column
    self_median, cross = (
        "ours.analysis.fixed_point_self_cos_median",
        "ours.min_cos_first_layer_to_other_layers_fixed_point",
    )

    def cell(row: pd.Series, stem: str) -> str:
        return f"{row[f'{stem}.mean']:.3f} ± {row[f'{stem}.std']:.3f}"

    body = []
    for _, row in cells.sort_values("variant").iterrows():
        _, placement, injection = row["variant"].split("-")
        wanted = "no" if injection == "none" else "yes"
        printed = paper[paper.norm.str.startswith(MECHANISTIC_NORMS[placement]) & (paper.input_injection == wanted)]
        printed = printed.iloc[0]
        values = {
            self_median: row["fixed_point_self_cos_median.mean"],
            cross: row["fixed_point_cross_cos_min.mean"],
            **{f"paper.{column}": printed[column] for column in judged.values()},
        }
        body.append(
            [
                placement,
                injection,
                row["variant"],
                _seeds(row["fixed_point_self_cos.n"]),
                f"{printed['norm']} / {wanted}",
                cell(row, "fixed_point_self_cos_median"),
                str(printed["cos_first_layer_to_own_fixed_point"]),
                cell(row, "fixed_point_cross_cos_min"),
                str(printed["min_cos_first_layer_to_other_layers_fixed_point"]),
                str(printed["verdict"]),
                cell(row, "fixed_point_self_cos"),
                cell(row, "state_norm_first"),
                cell(row, "state_norm_last"),
                cell(row, "update_ratio_mean"),
                mechanistic_verdict(values),
            ]
        )
    header = [
        "Placement", "Injection", "Variant", "Seeds", "Paper row", "Median per-sample self cos (ours)",
        "cos to own fixed point (paper)", "min cos to other layers (ours)", "min cos to other layers (paper)",
        "Verdict paper", "Mean self cos", "‖h‖ loop 1", "‖h‖ last loop", "Layer update ratio", "Reproduced",
    ]  # fmt: skip
    return markdown_table(header, body)


@register_block("stars-small/facts")
def _stars_small_facts(results_dir: Path) -> str:
    """The STARS paper's facts (stars_facts.csv, as printed) beside our analogue's seed aggregate, where one is
    defined (``studies.stars.paper.STARS_FACTS``), from ``stars-small/scaling.csv``."""
    facts, notes = read_paper_table("stars_facts.csv", PAPER_TABLES_DIR)
    if facts is None:
        return "\n".join(notes)
    cells = _read(results_dir, "stars-small/scaling.csv").set_index("variant")
    body = []
    for fact, printed in zip(facts["fact"], facts["value"]):
        variant, metric = STARS_FACTS.get(fact, (None, None))
        stem = metric_header(metric) if metric else None
        if variant is None or variant not in cells.index or f"{stem}.mean" not in cells.columns:
            body.append([fact, printed, "–", "–"])
            continue
        row = cells.loc[variant]
        ours = _t_cell(row[f"{stem}.n"], row[f"{stem}.mean"], row[f"{stem}.std"], 1, value_range(stem))
        body.append([fact, printed, ours, f"{stem}, {STARS_SMALL_TASK} / {variant}"])
    return markdown_table(["Fact", "Paper", "Ours", "Our analogue"], body)
