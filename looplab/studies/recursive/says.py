"""What the data say on the recursive-small and recursive-maze pages, generated: each rule's decision said as a
sentence (:func:`looplab.studies.prose.said`), with Holm's verdict where it differs
(:mod:`looplab.studies.recursive.verdicts`), and plain descriptions of the committed rows (seed means,
spans, counts). The pages' hand-written interpretation beside each block is marked as such.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from looplab.report.pages import register_block
from looplab.studies.prose import said, span
from looplab.studies.recursive.pages import (
    CONFIRM,
    EXPLORATORY,
    HALTING_FILE,
    MAZE,
    RUNS_FILE,
    STUDY,
    T_MAX,
    _decision_frame,
    _read,
)
from looplab.studies.recursive.paper import CONFIRM_COMPARISONS, decision_lines, halting_on_off
from looplab.studies.recursive.verdicts import Decision, decisions, line_name

HEADS = ("act_bce", "q_halt")
ONLINE_NEVER_HALT = ("rl_halting", "pondernet")  # the arms whose Policy is argmax π, read past T_max


def _decision(results_dir: Path, study: str, name: str) -> tuple[Decision, int]:
    """The page's decision called ``name`` (:func:`line_name`) and how many decisions the page makes."""
    found = decisions(results_dir, study)
    return next(d for d in found if line_name(d.line) == name), len(found)


def _said(results_dir: Path, study: str, name: str) -> str:
    """The decision said as a sentence, and Holm's verdict over the page's decisions where it differs."""
    d, m = _decision(results_dir, study, name)
    text = said(d.line)
    if d.holm_verdict != d.verdict:
        text += f" After Holm over the page's {m} decisions: {d.holm_verdict}."
    return text


def _mean(runs: pd.DataFrame, arm: str, column: str = "policy_id", scale: float = 100.0) -> float:
    return float(scale * runs.loc[runs.arm == arm, column].mean())


def _pct(runs: pd.DataFrame, arm: str, column: str = "policy_id") -> str:
    return f"{_mean(runs, arm, column):.1f} %"


def _pp(value: float) -> str:
    return f"{value:+.1f} pp"


def _difference(runs: pd.DataFrame, arm: str, other: str) -> str:
    """``arm`` − ``other``, the difference of Policy ID seed means in points."""
    return _pp(100 * (_mean(runs, arm, scale=1.0) - _mean(runs, other, scale=1.0)))


def _halting(results_dir: Path, study: str, runs: pd.DataFrame, arm: str, prefix: str = "") -> str:
    """The halting rule on ``arm`` as a sentence: verdict (and Holm's), interval to two decimals, which of the
    rule's lines the interval clears, depth, wall time, training loops per row."""
    d, m = _decision(results_dir, study, f"{prefix}halting on − off, {arm}")
    paired = halting_on_off(_decision_frame(runs), arm)
    if paired is None:
        return said(d.line)
    low, high = 100 * paired.low, 100 * paired.high
    holm = f" After Holm over the page's {m} decisions: {d.holm_verdict}." if d.holm_verdict != d.verdict else ""
    sides = []
    if low > 0:
        sides.append("its lower end lies above 0")
    if high > 2.0:
        sides.append(f"its upper end passes +2 pp by {high - 2.0:.2f}")
    return (
        f"**Halting on − off, {arm}: {d.verdict}.**{holm} ID accuracy {_pp(100 * paired.difference.mean())}, paired "
        f"95% [{low:+.2f}, {high:+.2f}] ({len(paired.difference)} seeds){': ' + ', '.join(sides) if sides else ''}; "
        f"mean depth with halting on {paired.depth:.2f} loops of {T_MAX}, wall time off / on "
        f"{paired.time_ratio:.2f}x; in training {_mean(runs, arm, 'train_loops_per_row', 1):.2f} loops per row."
    )


def _on_depth_by_size(results_dir: Path, study: str, arm: str, task: str | None = None) -> str:
    """Mean halting-on depth per in-distribution size, "3.14, 5.97 … at n = 3, 4 …"."""
    sizes = _read(results_dir, study, HALTING_FILE, task)
    part = sizes[(sizes.arm == arm) & (sizes.split == "id")].groupby("length").on_depth.mean()
    return f"{', '.join(f'{v:.2f}' for v in part)} at n = {', '.join(map(str, part.index))}"


def _never_halt(results_dir: Path, study: str, runs: pd.DataFrame, task: str | None = None) -> str:
    """RL-Halting's and PonderNet's online halting: depth on and on = off counts, and the Policy's depths."""
    sizes = _read(results_dir, study, HALTING_FILE, task)
    parts = []
    for arm in ONLINE_NEVER_HALT:
        part = runs[runs.arm == arm]
        depths = sizes[sizes.arm == arm].groupby("length").policy_depth.mean()
        parts.append(
            f"{arm}: halting-on depth {T_MAX} (T_max) at {int((part.on_id_depth == T_MAX).sum())} of {len(part)} "
            f"seeds, on equals off at {int((part.on_id == part.off_id).sum())} of {len(part)}, ID accuracy on "
            f"{_pct(runs, arm, 'on_id')}; Policy depth (argmax π over the evaluated loops) {span(depths, 1)} "
            f"loops over n = {depths.index.min()}..{depths.index.max()}"
        )
    return "; ".join(parts)


# ----------------------------------------------------------------------------- recursive-small


@register_block(f"{STUDY}/says-deep-supervision")
def small_deep_supervision(results_dir: Path) -> str:
    return _said(results_dir, STUDY, "deep supervision at a matched depth: ds_fixed − fixed")


@register_block(f"{STUDY}/says-heads")
def small_heads(results_dir: Path) -> str:
    """The attached heads against ds_fixed and each other; their accuracy with halting off."""
    runs = _read(results_dir, STUDY, RUNS_FILE)
    means = ", ".join(f"{arm} {_pct(runs, arm)}" for arm in (*HEADS, "ds_fixed"))
    off = " and ".join(f"{arm} {_pct(runs, arm, 'off_id')}" for arm in HEADS)
    costs = ", ".join(f"{arm} − ds_fixed {_difference(runs, arm, 'ds_fixed')}" for arm in HEADS)
    return (
        f"Policy ID seed means: {means}; with halting off, {off}. Differences of seed means (descriptions): "
        f"{costs}. {_said(results_dir, STUDY, 'halting rule: act_bce − ds_fixed')} "
        f"{_said(results_dir, STUDY, 'halting rule: act_bce − q_halt')}"
    )


@register_block(f"{STUDY}/says-halting")
def small_halting(results_dir: Path) -> str:
    runs = _read(results_dir, STUDY, RUNS_FILE)
    return (
        f"{_halting(results_dir, STUDY, runs, 'act_bce')} act_bce's halting-on depth by size: "
        f"{_on_depth_by_size(results_dir, STUDY, 'act_bce')}. {_halting(results_dir, STUDY, runs, 'q_halt')}"
    )


@register_block(f"{STUDY}/says-never-halt")
def small_never_halt(results_dir: Path) -> str:
    runs = _read(results_dir, STUDY, RUNS_FILE)
    means = " and ".join(f"{arm} {_pct(runs, arm)}" for arm in ONLINE_NEVER_HALT)
    rules = " ".join(_said(results_dir, STUDY, f"halting rule: act_bce − {arm}") for arm in ONLINE_NEVER_HALT)
    return f"Policy ID seed means {means}. {rules} {_never_halt(results_dir, STUDY, runs)}."


@register_block(f"{STUDY}/says-exploratory")
def small_exploratory(results_dir: Path) -> str:
    """The exploratory arms (3 seeds), described; the confirmatory study's rule 1 on fresh seeds, said."""
    runs = _read(results_dir, EXPLORATORY, RUNS_FILE)
    parts = []
    for arm in sorted(set(runs.arm)):
        part = runs[runs.arm == arm]
        parts.append(
            f"{arm} ({len(part)} seeds): Policy ID {100 * part.policy_id.mean():.1f} %, halting on / off "
            f"{100 * part.on_id.mean():.1f} / {100 * part.off_id.mean():.1f} %, halting-on depth "
            f"{part.on_id_depth.mean():.2f} loops, training {part.train_loops_per_row.mean():.2f} loops per row"
        )
    small = _read(results_dir, STUDY, RUNS_FILE)
    confirm = decision_lines(_decision_frame(_read(results_dir, CONFIRM, RUNS_FILE)), CONFIRM_COMPARISONS, (), ())
    return (
        f"*Exploratory* (chosen after seeing the data), seed means: {'; '.join(parts)}; ds_fixed here "
        f"{_pct(small, 'ds_fixed')}. On fresh seeds, recursive-confirm's rule 1: {' '.join(map(said, confirm))}"
    )


@register_block(f"{STUDY}/says-maze")
def small_maze(results_dir: Path) -> str:
    """recursive-maze's decisions on the same questions, said."""
    maze = _read(results_dir, MAZE, RUNS_FILE, "maze")
    costs = ", ".join(f"{arm} − ds_fixed {_difference(maze, arm, 'ds_fixed')}" for arm in HEADS)
    names = (
        "mazes, deep supervision at a matched depth: ds_fixed − fixed",
        "mazes, TRM's two states at matched core applications: trm − ds_fixed",
        "4×4 Sudoku, TRM's two states at matched core applications: trm − ds_fixed",
    )
    return (
        f"On mazes ([recursive-maze.md](recursive-maze.md)): {_said(results_dir, MAZE, names[0])} The heads "
        f"against ds_fixed, differences of seed means: {costs}. {_said(results_dir, MAZE, names[1])} "
        f"{_said(results_dir, MAZE, names[2])}"
    )


def _ood(runs: pd.DataFrame, what: str) -> str:
    """Policy and Oracle OOD: the span of the arms' seed means and the largest seed value."""
    means = runs.groupby("arm")[["policy_ood", "oracle_ood"]].mean()
    return (
        f"OOD ({what}), arm means over seeds: Policy OOD {span(means.policy_ood, 1, 100)} %, Oracle OOD "
        f"{span(means.oracle_ood, 1, 100)} % (seed values at most {100 * runs.oracle_ood.max():.1f} %). No rule "
        "decides on OOD."
    )


@register_block(f"{STUDY}/says-ood")
def small_ood(results_dir: Path) -> str:
    return _ood(_read(results_dir, STUDY, RUNS_FILE), "8 and 10 blanks")


# ----------------------------------------------------------------------------- recursive-maze


def _maze(results_dir: Path) -> pd.DataFrame:
    return _read(results_dir, MAZE, RUNS_FILE, "maze")


@register_block(f"{MAZE}/says-deep-supervision")
def maze_deep_supervision(results_dir: Path) -> str:
    runs = _maze(results_dir)
    return (
        f"{_said(results_dir, MAZE, 'mazes, deep supervision at a matched depth: ds_fixed − fixed')} Policy ID seed "
        f"means fixed {_pct(runs, 'fixed')}, ds_fixed {_pct(runs, 'ds_fixed')}. On 4×4 Sudoku (recursive-small): "
        f"{_said(results_dir, STUDY, 'deep supervision at a matched depth: ds_fixed − fixed')}"
    )


@register_block(f"{MAZE}/says-heads")
def maze_heads(results_dir: Path) -> str:
    runs = _maze(results_dir)
    means = ", ".join(f"{arm} {_pct(runs, arm)}" for arm in (*HEADS, "ds_fixed", "rl_halting", "pondernet"))
    rules = " ".join(
        _said(results_dir, MAZE, f"mazes, halting rule: act_bce − {other}")
        for other in ("ds_fixed", "pondernet", "q_halt", "rl_halting")
    )
    sudoku = _decision(results_dir, STUDY, "halting rule: act_bce − ds_fixed")[0]
    return (
        f"Policy ID seed means: {means}. {rules} On 4×4 Sudoku (recursive-small): {said(sudoku.line)} "
        f"q_halt − ds_fixed on mazes, difference of seed means: {_difference(runs, 'q_halt', 'ds_fixed')}."
    )


@register_block(f"{MAZE}/says-halting")
def maze_halting(results_dir: Path) -> str:
    runs = _maze(results_dir)
    return " ".join(_halting(results_dir, MAZE, runs, arm, "mazes, ") for arm in HEADS)


@register_block(f"{MAZE}/says-depth")
def maze_depth(results_dir: Path) -> str:
    """act_bce's and q_halt's halting-on depth per maze size; q_halt's accuracy at the largest ID size."""
    sizes = _read(results_dir, MAZE, HALTING_FILE, "maze")
    largest = sizes[sizes.split == "id"].length.max()
    at = sizes[(sizes.arm == "q_halt") & (sizes.length == largest)]
    return (
        "Halting applied per row, mean depth by maze side (a description): "
        + "; ".join(f"{arm} {_on_depth_by_size(results_dir, MAZE, arm, 'maze')}" for arm in HEADS)
        + f". q_halt's ID accuracy with halting on at n = {largest}: {100 * at.on_accuracy.mean():.1f} %."
    )


@register_block(f"{MAZE}/says-never-halt")
def maze_never_halt(results_dir: Path) -> str:
    return f"{_never_halt(results_dir, MAZE, _maze(results_dir), 'maze')}."


@register_block(f"{MAZE}/says-trm")
def maze_trm(results_dir: Path) -> str:
    runs = _maze(results_dir)
    sudoku, small = _read(results_dir, MAZE, RUNS_FILE, "sudoku4"), _read(results_dir, STUDY, RUNS_FILE)
    question = "TRM's two states at matched core applications: trm − ds_fixed"
    return (
        f"{_said(results_dir, MAZE, f'mazes, {question}')} (trm {_pct(runs, 'trm')}, ds_fixed "
        f"{_pct(runs, 'ds_fixed')}.) {_said(results_dir, MAZE, f'4×4 Sudoku, {question}')} (trm {_pct(sudoku, 'trm')}, "
        f"recursive-small's ds_fixed {_pct(small, 'ds_fixed')}.) Not a protocol comparison: trm − fixed on mazes, "
        f"difference of seed means {_difference(runs, 'trm', 'fixed')}."
    )


@register_block(f"{MAZE}/says-training")
def maze_training(results_dir: Path) -> str:
    loops = _maze(results_dir).groupby("arm").train_loops_per_row.mean()
    heads = ", ".join(f"{arm} {loops[arm]:.2f}" for arm in (*HEADS, "rl_halting", "pondernet"))
    return (
        f"Training loops per row, seed means: {heads}; fixed {loops['fixed']:.2f}, ds_fixed {loops['ds_fixed']:.2f}; "
        f"trm {loops['trm']:.2f} (its loops, each two core applications)."
    )


@register_block(f"{MAZE}/says-ood")
def maze_ood(results_dir: Path) -> str:
    return _ood(_maze(results_dir), "8×8 and 10×10")
