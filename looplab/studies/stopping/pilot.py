"""The stopping pilot's page (docs/results/stopping-study.md, exploratory): its verdicts as sentences.

Every statement of that page that reports a decision, a difference, an interval or a count is one
of these blocks, computed from the seed aggregates committed beside it (``stopping-small/``,
``stopping-pilot/``) by the aggregate rule of :mod:`looplab.studies.earlier`: the Welch interval of
the Gap difference and the F-interval of the std ratio (a bootstrap or a Brown–Forsythe test needs
per-seed rows these studies did not keep).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from looplab.report.effect import welch_from_stats
from looplab.report.pages import markdown_table, register_block
from looplab.studies.earlier import (
    EFFECT_HEADER,
    PILOT_REFERENCE,
    PROTOCOL_OTHERS,
    aggregate_effect,
    aggregate_effects,
)
from looplab.studies.prose import names, span
from looplab.studies.stopping.verdicts import interval, num

PROTOCOL, HALTING = "stopping-small/results.csv", "stopping-small/halting.csv"
B_HALTING = "stopping-pilot/B-binary_addition-nope-halting"
B_HORIZON = 16  # cell B′ reads up to 16 loops: π over 16 depths has at most ln 16 nats
#: the pilot's cells with seed aggregates: cell → its CSVs under stopping-pilot/ (one sweep each)
CELLS = {
    "B": ["B-binary_addition-nope.csv"],
    "C": ["C-dyck1-nope-window1.csv", "C-dyck1-nope-window1-rl_halting.csv"],
    "D": ["D-binary_addition-nope-window1.csv"],
    "F": ["C-dyck1-steps1800.csv"],
}
BEST_K = {
    "B": "B-binary_addition-nope-best_k.csv",
    "C": "C-dyck1-nope-window1-best_k.csv",
    "C (RL-Halting)": "C-dyck1-nope-window1-rl_halting-best_k.csv",
    "D": "D-binary_addition-nope-window1-best_k.csv",
}
TASK_NAMES = {"dyck1": "Dyck-1", "binary_addition": "binary addition"}


def _read(results_dir: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(Path(results_dir) / name)


def _rows(frame: pd.DataFrame, task: str) -> pd.DataFrame:
    return frame[frame["task.name"] == task].set_index("variant")


@register_block("stopping-study/verdict")
def verdict_block(results_dir: Path) -> str:
    """The protocol's verdict per task and half (aggregate rule), and the halting collapse count."""
    frame = _read(results_dir, PROTOCOL)
    lines = []
    for task in ("dyck1", "binary_addition"):
        rows = _rows(frame, task)
        others = [v for v in PROTOCOL_OTHERS if v in rows.index]
        results = {v: aggregate_effect(rows.loc[PILOT_REFERENCE], rows.loc[v]) for v in others}
        gap = [v for v in others if results[v].gap_holds]
        std = [v for v in others if results[v].std_holds]
        rest = [v for v in rows.index if v != PILOT_REFERENCE]
        name = TASK_NAMES[task][:1].upper() + TASK_NAMES[task][1:]
        lines.append(
            f"- **{name}, Gap half (Welch): holds against {len(gap)} of {len(others)}**"
            + (f" ({names(gap)})" if gap else "")
            + f". Fixed's Gap {num(rows.loc[PILOT_REFERENCE, 'gap_pp.mean'])} pp, theirs "
            f"{span([rows.loc[v, 'gap_pp.mean'] for v in others])}; differences "
            f"{span([results[v].gap_difference for v in others])} pp, Welch lower ends "
            f"{span([results[v].gap_welch[0] for v in others])}."
        )
        lines.append(
            f"- **{name}, Std half (F-interval alone): holds against {len(std)} of {len(others)}**"
            + (f" ({names(std)})" if std else "")
            + ". "
            + "; ".join(f"{v}: ratio {num(results[v].ratio, 2)}, F {interval(results[v].ratio_f, 2)}" for v in others)
            + f". Seed std of Oracle OOD: fixed {num(rows.loc[PILOT_REFERENCE, 'oracle_ood_pct.std'])} pp, the other "
            f"{len(rest)} schedules {span([rows.loc[v, 'oracle_ood_pct.std'] for v in rest])}; Oracle OOD "
            f"{span([rows.loc[v, 'oracle_ood_pct.mean'] for v in rows.index])} % over all {len(rows)}."
        )
    halting = _read(results_dir, HALTING)
    lines.append(
        "- **Halting collapse** (the rule of `looplab/studies/stopping/halting.py`): "
        f"{int(halting['collapsed'].sum())} "
        f"of {int(halting['seeds'].sum())} runs collapsed ({len(halting)} halting variants); depth / T(n) "
        f"{span(halting['depth_ratio.mean'], 2)}; entropy of π {span(halting['entropy.mean'], 2)} nats."
    )
    return "\n".join(lines)


def _halting_table(halting: pd.DataFrame, gaps: pd.DataFrame | None = None) -> str:
    body = []
    for _, row in halting.iterrows():
        cells = [
            TASK_NAMES.get(row["task.name"], row["task.name"]),
            str(row["variant"]),
            f"{row['depth_ratio.mean']:.2f} ± {row['depth_ratio.std']:.2f}",
            f"{row['entropy.mean']:.2f} ± {row['entropy.std']:.2f}",
            f"{int(row['collapsed'])} / {int(row['seeds'])}",
            f"{row['oracle_ood_pct.mean']:.1f} ± {row['oracle_ood_pct.std']:.1f}",
        ]
        if gaps is not None:
            gap = gaps.loc[row["variant"]]
            cells.append(f"{gap['gap_pp.mean']:.1f} ± {gap['gap_pp.std']:.1f}")
        body.append(cells)
    header = ["task", "variant", "depth / T(n)", "entropy (nats)", "collapsed", "Oracle OOD (%)"]
    return markdown_table(header + (["Gap (pp)"] if gaps is not None else []), body)


def _welch_line(a: pd.Series, b: pd.Series, stem: str, digits: int, unit: str) -> str:
    """ "stem difference [Welch]" of a − b from their mean / std over a.seeds / b.seeds."""
    low, high = welch_from_stats(
        a[f"{stem}.mean"], a[f"{stem}.std"], a["seeds"], b[f"{stem}.mean"], b[f"{stem}.std"], b["seeds"]
    )
    difference = a[f"{stem}.mean"] - b[f"{stem}.mean"]
    word = "resolved" if low > 0 or high < 0 else "interval through 0"
    return f"{num(difference, digits)}{unit} (Welch {interval((low, high), digits)}: {word})"


def _entropy_bonus_line(halting: pd.DataFrame, task: str) -> str:
    """λ_ent = 0.001 against λ_ent = 0 on depth, entropy and Oracle OOD (Welch from the aggregates)."""
    rows = _rows(halting, task)
    a, b = rows.loc["rl_halting"], rows.loc["rl_halting-ent0"]
    return (
        f"RL-Halting with λ_ent = 0.001 minus without ({TASK_NAMES[task]}, "
        f"{int(a['seeds'])} and {int(b['seeds'])} seeds): "
        f"depth / T(n) {_welch_line(a, b, 'depth_ratio', 2, '')}, entropy {_welch_line(a, b, 'entropy', 2, ' nats')}, "
        f"Oracle OOD {_welch_line(a, b, 'oracle_ood_pct', 1, ' pp')}."
    )


@register_block("stopping-study/halting")
def halting_block(results_dir: Path) -> str:
    """The protocol's halting variants (halting.csv), and what dropping the entropy bonus changes on Dyck-1."""
    halting = _read(results_dir, HALTING)
    return _halting_table(halting) + "\n\n" + _entropy_bonus_line(halting, "dyck1")


@register_block("stopping-study/halting-B")
def halting_b_block(results_dir: Path) -> str:
    """Cell B′ (halting where shallow depths can answer): the table, the entropy bonus, PonderNet's spread."""
    halting = _read(results_dir, f"{B_HALTING}-halting.csv")
    aggregates = _read(results_dir, f"{B_HALTING}.csv").set_index("variant")
    rows = halting.set_index("variant")
    ponder, rl = rows.loc["pondernet"], rows.loc["rl_halting"]
    lines = [
        _entropy_bonus_line(halting, "binary_addition"),
        f"Oracle ID ≥ {num(aggregates['oracle_id_pct.mean'].min())} % in every variant. PonderNet: seed std of "
        f"Oracle OOD {num(ponder['oracle_ood_pct.std'])} pp against RL-Halting's {num(rl['oracle_ood_pct.std'])}, "
        f"Gap {num(aggregates.loc['pondernet', 'gap_pp.mean'])} pp"
        + (f", the largest of the {len(aggregates)}" if aggregates["gap_pp.mean"].idxmax() == "pondernet" else "")
        + f", entropy "
        f"{num(ponder['entropy.mean'], 2)} nats of at most ln {B_HORIZON} = {num(math.log(B_HORIZON), 2)}.",
    ]
    return _halting_table(halting, aggregates) + "\n\n" + " ".join(lines)


def _cell_frame(results_dir: Path, files: list[str]) -> pd.DataFrame:
    return pd.concat([_read(results_dir, f"stopping-pilot/{f}") for f in files], ignore_index=True)


@register_block("stopping-study/pilot-effects")
def pilot_effects_block(results_dir: Path) -> str:
    """Every pilot cell's schedules against fixed, by the aggregate rule (Welch and F)."""
    body = []
    for cell, files in CELLS.items():
        frame = _cell_frame(results_dir, files)
        for task in sorted(frame["task.name"].unique()):
            others = [v for v in frame.loc[frame["task.name"] == task, "variant"] if v != PILOT_REFERENCE]
            body += [[cell, *row] for row in aggregate_effects(frame, task, PILOT_REFERENCE, others)]
    return markdown_table(["cell", *EFFECT_HEADER], body)


@register_block("stopping-study/pilot-best-k")
def pilot_best_k_block(results_dir: Path) -> str:
    """Best K per length (mean over seeds) for the pilot cells that kept it."""
    body, lengths = [], None
    for cell, name in BEST_K.items():
        frame = _read(results_dir, f"stopping-pilot/{name}")
        columns = [c for c in frame.columns if c.startswith("best_k.") and c.endswith(".mean")]
        found = [int(c.split(".")[1]) for c in columns]
        if lengths is not None and found != lengths:
            raise ValueError(f"{name}: lengths {found}, the other cells' {lengths}")
        lengths = found
        body += [[cell, row["variant"], *(f"{row[c]:.1f}" for c in columns)] for _, row in frame.iterrows()]
    return markdown_table(["cell", "schedule", *(f"n = {n}" for n in lengths)], body)


TRAINING_LENGTH = "stopping-pilot/C-dyck1-steps1800.csv"  # cell F: the protocol's Dyck-1 cell at 1800 steps


def _change(before: pd.Series, after: pd.Series, stem: str) -> str:
    """``stem``'s mean before → after, with the unpaired Welch interval of after − before (from aggregates)."""
    low, high = welch_from_stats(
        after[f"{stem}.mean"],
        after[f"{stem}.std"],
        after[f"{stem}.n"],
        before[f"{stem}.mean"],
        before[f"{stem}.std"],
        before[f"{stem}.n"],
    )
    difference = after[f"{stem}.mean"] - before[f"{stem}.mean"]
    word = "up" if low > 0 else "down" if high < 0 else "interval through 0"
    sign = "+" if difference >= 0 else ""
    return (
        f"{num(before[f'{stem}.mean'])} → {num(after[f'{stem}.mean'])} ({sign}{num(difference)}, "
        f"Welch {interval((low, high))}: {word})"
    )


@register_block("stopping-study/training-length")
def training_length_block(results_dir: Path) -> str:
    """Cell F (1800 steps) against the protocol's Dyck-1 cell (600 steps): Gap, Oracle OOD and spread per schedule."""
    before = _rows(_read(results_dir, PROTOCOL), "dyck1")
    after = _rows(_read(results_dir, TRAINING_LENGTH), "dyck1")
    variants = [v for v in after.index if v in before.index]
    seeds = f"{int(before.loc[variants[0], 'gap_pp.n'])} and {int(after.loc[variants[0], 'gap_pp.n'])} seeds"
    lines = [
        f"- {words}, 600 → 1800 steps ({seeds}; unpaired Welch from the aggregates): "
        + "; ".join(f"{v} {_change(before.loc[v], after.loc[v], stem)}" for v in variants)
        + "."
        for stem, words in (("gap_pp", "Gap (pp)"), ("oracle_ood_pct", "Oracle OOD (%)"))
    ]
    lines.append(
        "- Seed std of Oracle OOD, 600 → 1800 steps: "
        + "; ".join(
            f"{v} {num(before.loc[v, 'oracle_ood_pct.std'])} → {num(after.loc[v, 'oracle_ood_pct.std'])} pp"
            for v in variants
        )
        + "."
    )
    return "\n".join(lines)
