"""The STARS paper beside our sweeps: test-time scaling by variant, the paper's facts with our analogue
beside each, and (from the run dirs) the looped LMs' loop-scaling curves and relative drops.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from looplab.report.aggregate import SCALING_METRICS, STATS, present
from looplab.report.comparison import Ours, paper_value, read_paper_table, variant_stem
from looplab.report.paper import Paper, register_paper
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
from looplab.studies.stars.lm import CAPTIONS, CURVES_FILE, LM_TABLE_TITLE, stars_lm_tables, write_lm_outputs

# fact → (our variant, our metric). The paper's base model (Ouro) is an RMSNorm
# sandwich_output (= pre_sandwich) model trained at a fixed 4 loops: rmsnorm-pre_sandwich is ours.
STARS_FACTS = {
    "gsm8k_relative_drop_4_to_8_base_pct": ("rmsnorm-pre_sandwich", "relative_drop_4_to_8"),
    "gsm8k_relative_drop_4_to_8_stars_pct": ("stars-recipe", "relative_drop_4_to_8"),
    "addition_accuracy_stars_loops_4_to_100_pct": ("stars-recipe", "accuracy_min_4_to_100"),
}


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


register_paper(
    Paper(
        "stars",
        "STARS",
        stars_tables,
        stars_lm_tables,
        figures=write_lm_outputs,
        captions=CAPTIONS,
        figures_after={LM_TABLE_TITLE: ("loopscaling", "retrofitscaling")},
        files=(CURVES_FILE,),
    )
)
