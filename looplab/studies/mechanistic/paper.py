"""The mechanistic paper (A Mechanistic Analysis of Looped Reasoning Language Models) beside our sweeps:
fixed-point cosines by (placement, injection) against its norm-ablation table, with a verdict per row.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from looplab.config import PLACEMENT_ALIASES
from looplab.report.aggregate import aggregate, group_sizes, in_display_units, present
from looplab.report.comparison import Ours, Pair, compare_table
from looplab.report.paper import Paper, register_paper
from looplab.report.tables import Table

# our placements → its norm names (the config aliases are those names)
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
# how one of our seed means is held against a printed value (see mechanistic_verdict)
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


register_paper(Paper("mechanistic", "A Mechanistic Analysis of Looped Reasoning Language Models", mechanistic_tables))
