"""The committed results pages of the recursive-reasoner studies (docs/results/recursive-*.md): the per-seed
CSVs a sweep collects into, and the tables and decision lines the pages show, generated from those CSVs.

The decision rules themselves are :mod:`looplab.studies.recursive.paper`'s.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import numeric, seed_cell, t_interval
from looplab.report.comparison import variant_stem
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.studies.prose import said, span, verdict_of
from looplab.studies.recursive.paper import (
    CONFIRM_COMPARISONS,
    CONFIRM_MATCHES,
    CONFIRM_PAIRED,
    FREE_PP,
    MATCH_PP,
    PRIMARY,
    TRM_COMPARISON,
    arm_of,
    decision_lines,
    halting_on_off,
)

STUDY = "recursive-small"
#: runs chosen after reading the study's (docs/results/recursive-small/exploratory-*.toml)
EXPLORATORY = "recursive-small-exploratory"
#: the confirmatory study of the head's gradient (docs/results/recursive-confirm/PROTOCOL.md)
CONFIRM = "recursive-confirm"
#: mazes and TRM's recurrence (docs/results/recursive-maze/PROTOCOL.md)
MAZE = "recursive-maze"
#: what a task's size n counts, for the by-size tables
SIZE_NAMES = {"sudoku4": "n (blanks)", "sudoku9": "n (blanks)", "maze": "n (side)"}
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
#: the loops a row can run: at least one, at most T_max = 8 (every recursive study's protocol), so a mean
#: depth's or a mean loops-per-row's interval lies in this range
T_MAX = 8
DEPTH_RANGE = (1.0, float(T_MAX))
#: runs.csv columns only an arm with a halting head has
HEAD_COLUMNS = ("on_id", "off_id", "on_ood", "off_ood", "on_id_depth", "on_ood_depth", "on_seconds", "off_seconds")
ARM_ORDER = (
    "fixed",
    "ds_fixed",
    "act_bce",
    "act_bce_detached",
    "q_halt",
    "q_halt_detached",
    "rl_halting",
    "pondernet",
    "trm",
)

for _frozen in (STUDY, CONFIRM, MAZE):
    register_frozen(_frozen, f"{_frozen}/PROTOCOL.md")


@register_collector(MAZE)
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
            "task": results["task.name"].astype(str),
            "arm": arm_of(results),
            "seed": results["run.seed"].astype(int),
            "run_id": results["run_id"],
            **{name: numeric(results, column) if column in results else np.nan for name, column in RUN_COLUMNS.items()},
        }
    )
    all_lengths = sorted({int(c.split(".")[1]) for c in results.columns if c.startswith("per_length.")})
    sizes = []
    for (_, run), arm in zip(results.iterrows(), runs["arm"]):
        # the union of every run's sizes: keep this run's own (tasks in one sweep evaluate different sizes)
        lengths = [n for n in all_lengths if pd.notna(run.get(f"per_length.{n}.split"))]
        halting_csv = Path(run["sweep_dir"]) / "runs" / run["run_id"] / "eval" / HALTING_FILE
        halting = pd.read_csv(halting_csv).set_index("length") if halting_csv.is_file() else None
        for n in lengths:
            row = {
                "task": run["task.name"],
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
    runs = runs.sort_values(["task", "arm", "seed"], key=lambda c: c.map(_arm_rank) if c.name == "arm" else c)
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


def _read(results_dir: Path, study: str, file: str, task: str | None = None) -> pd.DataFrame:
    """The study's runs.csv or halting.csv, only ``task``'s rows when given (files without a task
    column hold one task: recursive-small's and recursive-confirm's, 4×4 Sudoku)."""
    frame = pd.read_csv(results_dir / study / file)
    return frame if task is None or "task" not in frame else frame[frame.task == task]


def arms_table(results_dir: Path, study: str, task: str | None = None) -> str:
    """Per arm of the study's runs.csv (``task``'s rows when given): Policy and Oracle, halting on / off,
    depth and training cost (mean ± std [t-interval])."""
    runs = _read(results_dir, study, RUNS_FILE, task)
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
            else seed_cell(part[c], scale, d, (0.0, 1.0) if scale == 100 else DEPTH_RANGE)
            for _, c, scale, d in columns
        ]
        body.append([arm, str(len(part)), *cells])
    return markdown_table(["arm", "seeds", *(title for title, *_ in columns)], body)


@register_block(f"{STUDY}/decisions")
def decisions_block(results_dir: Path) -> str:
    """The protocol's decisions, one line each, from runs.csv."""
    return "\n".join(f"- {line}" for line in decision_lines(_decision_frame(_read(results_dir, STUDY, RUNS_FILE))))


@register_block(f"{MAZE}/decisions")
def maze_decisions_block(results_dir: Path) -> str:
    """The maze protocol's decisions: recursive-small's rules on mazes, then TRM's recurrence per task
    (on 4×4 Sudoku against recursive-small's ds_fixed rows)."""
    mazes = _decision_frame(_read(results_dir, MAZE, RUNS_FILE, "maze"))
    lines = [f"mazes, {line}" for line in decision_lines(mazes)]
    lines += [f"mazes, {line}" for line in decision_lines(mazes, (TRM_COMPARISON,), ())]
    sudoku = pd.concat(
        [
            _read(results_dir, MAZE, RUNS_FILE, "sudoku4"),
            _read(results_dir, STUDY, RUNS_FILE).query("arm == 'ds_fixed'"),
        ]
    )
    lines += [f"4×4 Sudoku, {line}" for line in decision_lines(_decision_frame(sudoku), (TRM_COMPARISON,), ())]
    return "\n".join(f"- {line}" for line in lines)


@register_block(f"{CONFIRM}/decisions")
def confirm_decisions_block(results_dir: Path) -> str:
    """The confirmatory protocol's decisions, one line each, from its runs.csv."""
    frame = _decision_frame(_read(results_dir, CONFIRM, RUNS_FILE))
    lines = decision_lines(frame, CONFIRM_COMPARISONS, CONFIRM_PAIRED, CONFIRM_MATCHES)
    return "\n".join(f"- {line}" for line in lines)


# ------------------------------------------------------------- recursive-confirm: what the data say, generated
# The rules' lines said as sentences (looplab.studies.prose) and descriptions of the committed rows; the
# page's hand-written interpretation beside each block is marked as such.


def _policy(runs: pd.DataFrame, arm: str) -> pd.Series:
    return runs.loc[runs.arm == arm].set_index("seed").policy_id


def _pp(value: float) -> str:
    return f"{100 * value:+.1f} pp"


@register_block(f"{CONFIRM}/says-detaching")
def says_detaching(results_dir: Path) -> str:
    """Rule 1 said; the attached arms and ds_fixed beside recursive-small's (seed means)."""
    runs, small = _read(results_dir, CONFIRM, RUNS_FILE), _read(results_dir, STUDY, RUNS_FILE)
    lines = decision_lines(_decision_frame(runs), CONFIRM_COMPARISONS, (), ())
    repeated = ", ".join(
        f"{arm} {100 * _policy(runs, arm).mean():.1f} % and {100 * _policy(small, arm).mean():.1f} %"
        for arm in ("act_bce", "q_halt", "ds_fixed")
    )
    return f"{' '.join(map(said, lines))} Policy ID seed means here and in recursive-small: {repeated}."


@register_block(f"{CONFIRM}/says-no-head")
def says_no_head(results_dir: Path) -> str:
    """Rule 2 said, how many of its intervals lie within the margin, the seed spreads, and the exploratory
    paired reading."""
    runs = _read(results_dir, CONFIRM, RUNS_FILE)
    lines = decision_lines(_decision_frame(runs), (), (), CONFIRM_MATCHES)
    within = sum(verdict_of(line).startswith("matches") for line in lines)
    arms = [arm for _, arm, other, *_ in CONFIRM_MATCHES]
    spread = ", ".join(f"{arm} {100 * _policy(runs, arm).std():.1f}" for arm in ("ds_fixed", *arms))
    paired = []
    for arm in arms:
        difference = (_policy(runs, arm) - _policy(runs, "ds_fixed")).dropna()
        low, high = np.clip(t_interval(difference.to_numpy()), -1.0, 1.0)
        paired.append(
            f"{arm} − ds_fixed {_pp(difference.mean())}, paired 95% [{100 * low:+.1f}, {100 * high:+.1f}] "
            f"({len(difference)} seeds)"
        )
    return (
        f"{' '.join(map(said, lines))} {within} of {len(lines)} intervals lie within the ±{MATCH_PP:g} pp the "
        f'protocol asks for "matches". Seed std of Policy ID (pp): {spread}. *Exploratory* (chosen after '
        f"seeing the data: a seed draws the same boards for every arm, so arms can be paired by seed): "
        f"{'; '.join(paired)}."
    )


@register_block(f"{CONFIRM}/says-halting")
def says_halting(results_dir: Path) -> str:
    """Rule 3 said to the digits that show how near its interval lies to the rule's boundaries; the seeds that
    lose, the depth and the wall time."""
    runs = _read(results_dir, CONFIRM, RUNS_FILE)
    (arm,) = CONFIRM_PAIRED
    paired = halting_on_off(_decision_frame(runs), arm)
    if paired is None:
        return said(decision_lines(_decision_frame(runs), (), CONFIRM_PAIRED, ())[0])
    low, high = 100 * paired.low, 100 * paired.high
    edges = [
        (abs(high), f'the upper end, {high:+.3f} pp, against 0, below which the rule reads "halting costs accuracy"'),
        (abs(low + FREE_PP), f'the lower end, {low:+.3f} pp, against −{FREE_PP:g} pp, the edge of "halting is free"'),
        (abs(FREE_PP - high), f'the upper end, {high:+.3f} pp, against +{FREE_PP:g} pp, the edge of "halting is free"'),
    ]
    loss = -100 * paired.difference
    training = runs.groupby("arm").train_loops_per_row.mean()
    return (
        f"**Halting on − off, {arm}: {paired.verdict}.** ID accuracy {100 * paired.difference.mean():+.2f} pp, "
        f"paired 95% [{low:+.3f}, {high:+.3f}] ({len(loss)} seeds); nearest a boundary of the rule is "
        f"{min(edges)[1]}. Per seed with halting on, {int((loss > 0).sum())} of {len(loss)} lose accuracy "
        f"({span(loss[loss > 0], 2)} pp), {int((loss == 0).sum())} of {len(loss)} neither lose nor gain, "
        f"{int((loss < 0).sum())} of {len(loss)} gain. "
        f"Mean depth with halting on {paired.depth:.2f} loops of {T_MAX} ({100 * paired.depth / T_MAX:.0f} %), "
        f"wall time off / on {paired.time_ratio:.2f}x; in training {training[arm]:.2f} loops per row, ds_fixed "
        f"{training['ds_fixed']:.2f}."
    )


@register_block(f"{CONFIRM}/says-q-halt")
def says_q_halt(results_dir: Path) -> str:
    """q_halt_detached's halting-on depth and accuracy against halting off, seed by seed (a description)."""
    runs = _read(results_dir, CONFIRM, RUNS_FILE)
    part = runs[runs.arm == "q_halt_detached"]
    return (
        f"q_halt_detached, with halting on (a description): mean depth {T_MAX} loops (T_max) at "
        f"{int((part.on_id_depth == T_MAX).sum())} of {len(part)} seeds; ID accuracy on equals off at "
        f"{int((part.on_id == part.off_id).sum())} of {len(part)} seeds."
    )


@register_block(f"{CONFIRM}/says-attached")
def says_attached(results_dir: Path) -> str:
    """The attached heads against ds_fixed: differences of seed means here (no rule of this protocol) and
    recursive-small's rule on act_bce − ds_fixed."""
    runs, small = _read(results_dir, CONFIRM, RUNS_FILE), _read(results_dir, STUDY, RUNS_FILE)

    def differences(frame: pd.DataFrame) -> str:
        return ", ".join(
            f"{arm} − ds_fixed {_pp(_policy(frame, arm).mean() - _policy(frame, 'ds_fixed').mean())}"
            for arm in ("act_bce", "q_halt")
        )

    rule = next(line for line in decision_lines(_decision_frame(small)) if "act_bce − ds_fixed" in line)
    return (
        f"The attached heads against deep supervision without a head, differences of Policy ID seed means "
        f"(descriptions): here {differences(runs)}; in recursive-small {differences(small)}. Recursive-small's "
        f"rule on it: {said(rule)}"
    )


def _decision_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """runs.csv rows in the columns :func:`decision_lines` reads."""
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


def by_size_table(results_dir: Path, study: str, task: str = "sudoku4") -> str:
    """Per arm and size of ``task``: Oracle, Policy and (with a head) halting on / off accuracy and depth,
    seed means."""
    sizes = _read(results_dir, study, HALTING_FILE, task)
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
    header = [
        "arm",
        SIZE_NAMES.get(task, "n"),
        "split",
        "Oracle (%)",
        "Policy (%)",
        "policy depth",
        "on (%)",
        "off (%)",
        "on depth",
    ]
    return markdown_table(header, body)


def halting_table(results_dir: Path, study: str, task: str | None = None) -> str:
    """Per arm of the study's runs.csv (``task``'s rows when given) with a head: halting on against off in
    distribution (accuracy, depth, wall time), seed means."""
    runs = _read(results_dir, study, RUNS_FILE, task)
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
                seed_cell(part.on_id_depth, 1, 2, DEPTH_RANGE),
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


#: the tables each study's page shows: block "<study>/<table>" (or "<study>/<table>-<task>"), and its task
STUDY_TABLES = {
    STUDY: ((arms_table, None), (halting_table, None), (by_size_table, None)),
    EXPLORATORY: ((arms_table, None),),
    CONFIRM: ((arms_table, None), (halting_table, None)),
    MAZE: (
        (arms_table, "maze"),
        (halting_table, "maze"),
        (by_size_table, "maze"),
        (arms_table, "sudoku4"),
    ),
}
for _study, _tables in STUDY_TABLES.items():
    for _table, _task in _tables:
        _name = _table.__name__.removesuffix("_table").replace("_", "-") + (f"-{_task}" if _task else "")
        _options = {"study": _study} if _task is None else {"study": _study, "task": _task}
        register_block(f"{_study}/{_name}")(partial(_table, **_options))
