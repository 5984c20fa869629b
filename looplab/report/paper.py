"""Our seed statistics beside each paper's published numbers, and the registry of papers.

A paper is a registered :class:`Paper`: its name (``looplab report --paper NAME``,
and the prefix of its reproduction sweeps ``configs/sweeps/NAME-*.toml``), its
title, and the function that builds its comparison tables (plus, optionally,
tables read from the run dirs). How one table is built (and where the paper
numbers come from) is in ``comparison.py``; what lives here is the mapping
from our names to each paper's:

    stopping     schedule variants → the paper's schedule / config names
    stars        our variants → the facts they are the analogue of
    mechanistic  model.placement / model.injection → the paper's norm / input_injection
    recursive    our arms beside TRM's and HRM's published numbers (``recursive.py``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from looplab.config import PLACEMENT_ALIASES
from looplab.errors import choice_error
from looplab.plugins import register_entry
from looplab.report.aggregate import SCALING_METRICS, STATS, aggregate, group_sizes, in_display_units, present
from looplab.report.comparison import (
    PAPER_TABLES_DIR,
    Ours,
    Pair,
    compare_table,
    paper_value,
    read_paper_table,
    variant_stem,
)
from looplab.report.effect import effect_tests
from looplab.report.halting import halting_table
from looplab.report.recursive import recursive_tables
from looplab.report.stars_lm import stars_lm_tables
from looplab.report.stopping import (
    best_k_table,
    paper_cost_ratio,
    paper_front_ratio,
    protocol_lines,
    protocol_table,
    schedule_label,
    stopping_conclusions,
    with_scale_free_metrics,
)
from looplab.report.tables import (
    MISSING,
    Table,
    cell,
    decimals,
    group_key,
    header,
    metric_stats,
    seed_table,
    stats_by_group,
)


@dataclass(frozen=True)
class Paper:
    """A paper compared against.

    Attributes:
        name: what ``--paper`` takes, and the prefix of its reproduction sweeps.
        title: the paper's title, as a report names it.
        tables: (our seed statistics, the paper-tables folder) → (tables, notes).
        run_tables: (results, sweep dir, paper-tables folder) → more tables read from the run dirs, or None.
    """

    name: str
    title: str
    tables: Callable[[Ours, Path], tuple[list[Table], list[str]]]
    run_tables: Callable[[pd.DataFrame, Path, Path], list[Table]] | None = None

    @property
    def origin(self) -> str:
        return f"{self.tables.__module__}.{self.tables.__qualname__}"


PAPERS: dict[str, Paper] = {}


def register_paper(paper: Paper) -> Paper:
    """Make ``paper`` available to ``looplab report --paper``."""
    register_entry(PAPERS, paper.name, paper, "paper")
    return paper


# paper 1: our schedule stems → the schedule names of stopping_main.csv and stopping_cost.csv
STOPPING_SCHEDULES = {
    "fixed": "fixed_K20",
    "matched": "matched_K_n",
    "window": "window_n_pm5",
    "rl_halting": "rl_halting",
}
# … and → the config names of the ablation table, which the paper ran on one task only
STOPPING_ABLATION_TASK = "binary_addition"
STOPPING_ABLATIONS = {
    "fixed": "fixed_K20",
    "fixed_window": "fixed_window_K20_pm5",
    "pondernet": "pondernet_weighted_loss",
    "multi_depth": "multi_depth_average",
    "window": "window_n_pm5_single_depth",
    "rl_halting": "rl_halting_ent0.001",
    "rl_halting-ent0": "rl_halting_ent0",
    "rl_halting-ent0.1": "rl_halting_ent0.1",
    "rl_halting-tmax5": "rl_halting_Tmax5",
    "rl_halting-tmax10": "rl_halting_Tmax10",
}
# paper 2: fact → (our variant, our metric). The paper's base model (Ouro) is an RMSNorm
# sandwich_output (= pre_sandwich) model trained at a fixed 4 loops: rmsnorm-pre_sandwich is ours.
STARS_FACTS = {
    "gsm8k_relative_drop_4_to_8_base_pct": ("rmsnorm-pre_sandwich", "relative_drop_4_to_8"),
    "gsm8k_relative_drop_4_to_8_stars_pct": ("stars-recipe", "relative_drop_4_to_8"),
    "addition_accuracy_stars_loops_4_to_100_pct": ("stars-recipe", "accuracy_min_4_to_100"),
}
# paper 3: our placements → its norm names (the config aliases are those names)
MECHANISTIC_NORMS = {"pre": "pre_norm", **{ours: paper for paper, ours in PLACEMENT_ALIASES.items()}}
MECHANISTIC_BY = ["model.placement", "model.injection", "variant"]  # variant: never pool a control with a model
MECHANISTIC_METRICS = (
    "analysis.fixed_point_self_cos",
    "analysis.fixed_point_cross_cos_min",
    "analysis.fixed_point_self_cos_median",
    "analysis.state_norm_first",
    "analysis.state_norm_last",
    "analysis.update_ratio_mean",
)
# paper 3: how one of our seed means is held against a printed value (see mechanistic_verdict)
COSINE_ONE, COSINE_TOLERANCE = 0.99, 0.05
MECHANISTIC_RULE = (
    f"Reproduced: both paper cosines are met by our seed means ('1.000': >= {COSINE_ONE}; "
    f"'<x': < x; any other value v: within ±{COSINE_TOLERANCE}), the self cosine read as the "
    "median per-sample value (one oscillating sequence neither hides nor drags the rest); "
    "'partly' when one of the two is met."
)
# paper column → the value of ours the verdict holds against it
MECHANISTIC_JUDGED = {
    "cos_first_layer_to_own_fixed_point": "ours.analysis.fixed_point_self_cos_median",
    "min_cos_first_layer_to_other_layers_fixed_point": "ours.min_cos_first_layer_to_other_layers_fixed_point",
}


def check_paper(paper: str) -> Paper:
    """The registered paper ``paper``; a one-line error naming the valid ones."""
    if paper not in PAPERS:
        raise choice_error("paper", paper, PAPERS)
    return PAPERS[paper]


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
        lambda g: {"task": g["task.name"], "schedule": STOPPING_SCHEDULES.get(variant_stem(g["variant"]))},
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
            {"config": STOPPING_ABLATIONS.get(variant_stem(g["variant"]))}
            if g["task.name"] == STOPPING_ABLATION_TASK
            else None
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
        lambda g: {"schedule": STOPPING_SCHEDULES.get(variant_stem(g["variant"]))},
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


def stars_tables(ours: Ours, tables_dir: Path) -> tuple[list[Table], list[str]]:
    """Paper 2: our test-time scaling by variant, and the paper's facts with our analogue beside each."""
    metrics = present(ours.results, (*SCALING_METRICS, "oracle_id"))
    scaling = replace(
        seed_table(
            "Ours: test-time scaling by variant (STARS)",
            ours.groups,
            ours.long[ours.long["metric"].isin(metrics)],
            ours.by,
        ),
        name="paper_stars_scaling",
    )
    facts, notes = read_paper_table("stars_facts.csv", tables_dir)
    if facts is None or not {"fact", "value"} <= set(facts.columns):
        return [scaling], notes or ["paper table stars_facts.csv lacks its fact / value columns: left out"]
    stats = stats_by_group(ours.long, ours.by)
    groups = [dict(zip(ours.by, g)) for g in ours.groups[ours.by].itertuples(index=False, name=None)]
    display, numbers = [], []
    for fact, text in zip(facts["fact"], facts["value"]):
        variant, metric = STARS_FACTS.get(fact, (None, ""))
        matches = [g for g in groups if variant is not None and variant_stem(g["variant"]) == variant]
        for group in matches or [None]:  # a fact with no analogue in the sweep still gets its row
            s = metric_stats(stats.get(group_key(tuple(group.values()))) if group else None, metric)
            if variant is None:
                source = MISSING
            elif group is None:
                source = f"{variant}: not in this sweep"
            else:
                source = f"{header(metric)}, {' / '.join(map(str, group.values()))}"
            display.append({"Fact": fact, "Paper": text, "Ours": cell(s, decimals(metric)), "Our analogue": source})
            numbers.append(
                {
                    "fact": fact,
                    "paper": paper_value(text),
                    "ours.source": source,
                    **{f"ours.{stat}": s[stat] for stat in STATS},
                }
            )
    table = Table(
        "Ours vs paper: STARS facts",
        pd.DataFrame(display),
        pd.DataFrame(numbers),
        "paper numbers from stars_facts.csv",
        "paper_stars_facts",
    )
    return [scaling, table], notes


def mechanistic_tables(ours: Ours, tables_dir: Path) -> tuple[list[Table], list[str]]:
    """Paper 3: fixed-point cosines by (placement, injection) beside the norm-ablation table."""
    results = ours.results
    missing = [c for c in MECHANISTIC_BY if c not in results.columns]
    metrics = present(results, MECHANISTIC_METRICS)
    if missing or not metrics:
        what = f"column(s) {', '.join(missing)}" if missing else "analysis.fixed_point_* values"
        return [], [f"no {what} in results.parquet: the mechanistic comparison needs runs analysed by the sweep"]
    analysed = results[results[metrics].apply(pd.to_numeric, errors="coerce").notna().any(axis=1)]
    by_model = Ours(
        analysed,
        group_sizes(analysed, MECHANISTIC_BY),
        in_display_units(aggregate(analysed, MECHANISTIC_BY, metrics)),
        MECHANISTIC_BY,
    )
    return compare_table(
        "Ours vs paper: fixed points by norm placement and input injection",
        "mechanistic_norm_ablation.csv",
        by_model,
        tables_dir,
        lambda g: {
            "norm": MECHANISTIC_NORMS.get(g["model.placement"]),
            "input_injection": "no" if g["model.injection"] == "none" else "yes",
        },
        [
            Pair("cos to own fixed point", "cos_first_layer_to_own_fixed_point", "analysis.fixed_point_self_cos"),
            Pair(
                "min cos to other layers",
                "min_cos_first_layer_to_other_layers_fixed_point",
                "analysis.fixed_point_cross_cos_min",
            ),
            Pair("Verdict", "verdict"),
            Pair("Median per-sample self cos", None, "analysis.fixed_point_self_cos_median"),
            Pair("‖h‖ loop 1", None, "analysis.state_norm_first"),
            Pair("‖h‖ last loop", None, "analysis.state_norm_last"),
            Pair("Layer update ratio", None, "analysis.update_ratio_mean"),
        ],
        mechanistic_verdict,
        MECHANISTIC_RULE,
    )


def meets(ours: float | None, printed) -> bool:
    """Whether our value meets a printed paper value: "1.000" → ≥ COSINE_ONE, "<x" → < x, v → within tolerance."""
    if ours is None or pd.isna(ours) or printed is None:
        return False
    if isinstance(printed, str):
        text = printed.strip()
        if text.startswith("<"):
            return ours < float(text[1:])
        printed = float(text)
    if printed == 1.0:
        return ours >= COSINE_ONE
    return abs(ours - printed) <= COSINE_TOLERANCE


def mechanistic_verdict(values: dict) -> str:
    """ "reproduced" / "partly" / "not reproduced" for one norm-ablation row by :func:`meets`."""
    met = sum(meets(values.get(ours), values.get(f"paper.{paper}")) for paper, ours in MECHANISTIC_JUDGED.items())
    return {2: "reproduced", 1: "partly"}.get(met, "not reproduced")


def compare(paper: str, ours: Ours, tables_dir: Path | None = None) -> tuple[list[Table], list[str]]:
    """The comparison tables for ``paper`` and notes on what could not be compared."""
    return check_paper(paper).tables(ours, tables_dir or PAPER_TABLES_DIR)


register_paper(Paper("stopping", "Learned Stochastic Stopping", stopping_tables))
register_paper(Paper("stars", "STARS", stars_tables, stars_lm_tables))
register_paper(Paper("mechanistic", "A Mechanistic Analysis of Looped Reasoning Language Models", mechanistic_tables))
register_paper(Paper("recursive", "Recursive reasoners: TRM and HRM", recursive_tables))
