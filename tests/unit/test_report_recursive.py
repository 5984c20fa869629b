"""The recursive-reasoner report's decision rules (looplab/studies/recursive/paper.py) and its pages' collector and
blocks (looplab/studies/recursive/pages.py)."""

import numpy as np
import pandas as pd
import pytest

from looplab.studies.recursive.pages import collect, maze_decisions_block
from looplab.studies.recursive.paper import decision_lines


def _runs(policy: dict[str, list[float]], on_off: dict[str, tuple[list[float], list[float]]] | None = None):
    rows = []
    for arm, values in policy.items():
        for seed, value in enumerate(values):
            row = {"variant": arm, "run.seed": 200 + seed, "policy_id": value}
            if on_off and arm in on_off:
                on, off = on_off[arm]
                row.update(
                    {
                        "halting_inference.on_id": on[seed],
                        "halting_inference.off_id": off[seed],
                        "halting_inference.on_id_depth": 5.0,
                        "halting_inference.on_seconds": 1.0,
                        "halting_inference.off_seconds": 2.0,
                    }
                )
            rows.append(row)
    return pd.DataFrame(rows)


def _line(lines, start):
    return next(line for line in lines if line.startswith(start))


@pytest.mark.parametrize(
    "ds, fixed, verdict",
    [
        ([0.6, 0.62, 0.61, 0.63, 0.6], [0.4, 0.42, 0.41, 0.39, 0.4], "helps"),
        ([0.4, 0.42, 0.41, 0.39, 0.4], [0.6, 0.62, 0.61, 0.63, 0.6], "hurts"),
        ([0.5, 0.7, 0.3, 0.6, 0.4], [0.45, 0.65, 0.35, 0.55, 0.5], "not resolved"),
    ],
)
def test_deep_supervision_verdict_follows_the_welch_interval(ds, fixed, verdict):
    lines = decision_lines(_runs({"ds_fixed": ds, "fixed": fixed}))
    assert _line(lines, "deep supervision").endswith(verdict)


def test_a_comparison_without_two_seeds_a_side_is_undefined():
    lines = decision_lines(_runs({"act_bce": [0.5], "q_halt": [0.4, 0.5]}))
    assert "act_bce vs q_halt: n/a (1 and 2 seeds" in _line(lines, "halting rule: act_bce vs q_halt")


@pytest.mark.parametrize(
    "on, off, verdict",
    [
        ([0.50, 0.51, 0.49, 0.50, 0.50], [0.50, 0.50, 0.50, 0.50, 0.50], "halting is free"),
        ([0.40, 0.41, 0.39, 0.40, 0.40], [0.50, 0.50, 0.50, 0.50, 0.50], "halting costs accuracy"),
        ([0.40, 0.60, 0.45, 0.58, 0.50], [0.50, 0.50, 0.50, 0.50, 0.50], "not resolved"),
    ],
)
def test_halting_on_against_off_is_paired_by_seed(on, off, verdict):
    lines = decision_lines(_runs({"act_bce": on}, {"act_bce": (on, off)}))
    line = _line(lines, "halting on − off, act_bce")
    assert verdict in line and "wall time off / on 2.00x" in line
    assert f"{100 * np.mean(np.subtract(on, off)):+.1f} pp" in line


@pytest.mark.parametrize(
    "detached, none, verdict",
    [
        ([0.74, 0.75, 0.73, 0.74, 0.75], [0.745, 0.74, 0.75, 0.735, 0.745], "matches (within ±5 pp)"),
        ([0.60, 0.61, 0.59, 0.60, 0.60], [0.745, 0.74, 0.75, 0.735, 0.745], "worse"),
        ([0.60, 0.85, 0.65, 0.80, 0.70], [0.745, 0.74, 0.75, 0.735, 0.745], "not resolved"),
    ],
)
def test_confirmatory_detached_head_against_no_head_reads_matches_inside_the_margin(detached, none, verdict):
    from looplab.studies.recursive.paper import CONFIRM_COMPARISONS, CONFIRM_MATCHES, CONFIRM_PAIRED

    runs = _runs({"act_bce_detached": detached, "ds_fixed": none, "act_bce": [0.3, 0.35, 0.4, 0.32, 0.38]})
    lines = decision_lines(runs, CONFIRM_COMPARISONS, CONFIRM_PAIRED, CONFIRM_MATCHES)
    assert _line(lines, "a detached head against no head: act_bce_detached − ds_fixed").endswith(verdict)
    assert _line(lines, "detaching the head: act_bce_detached − act_bce").endswith("helps")
    assert "q_halt_detached vs q_halt: n/a (0 and 0 seeds" in _line(lines, "detaching the head: q_halt_detached")


def test_the_maze_decisions_read_each_task_apart_and_take_sudokus_ds_fixed_from_recursive_small(tmp_path):
    """TRM on mazes is compared with the maze ds_fixed rows only; on 4×4 Sudoku with recursive-small's."""
    columns = ["on_id", "off_id", "on_id_depth", "on_seconds", "off_seconds"]

    def rows(task, arm, values):
        return [{"task": task, "arm": arm, "seed": 200 + i, "policy_id": v, **dict.fromkeys(columns)} for i, v in
                enumerate(values)]  # fmt: skip

    maze = rows("maze", "ds_fixed", [0.40, 0.41, 0.42, 0.40, 0.41]) + rows("maze", "trm", [0.6, 0.61, 0.62, 0.6, 0.6])
    maze += rows("sudoku4", "trm", [0.30, 0.31, 0.30, 0.32, 0.30])
    small = [{k: v for k, v in row.items() if k != "task"} for row in rows("sudoku4", "ds_fixed", [0.7] * 4 + [0.71])]
    for study, frame in (("recursive-maze", maze), ("recursive-small", small)):
        (tmp_path / study).mkdir()
        pd.DataFrame(frame).to_csv(tmp_path / study / "runs.csv", index=False)
    lines = maze_decisions_block(tmp_path).splitlines()
    assert _line(lines, "- mazes, TRM's two states").endswith("better")
    assert _line(lines, "- 4×4 Sudoku, TRM's two states").endswith("worse")
    assert "n/a" in _line(lines, "- mazes, deep supervision")  # no maze fixed arm here: undefined, not 0


def test_collect_keeps_each_runs_own_sizes_when_tasks_in_one_sweep_differ(tmp_path):
    """A maze run (sides 3, 8) and a Sudoku run (blanks 2, 4) in one sweep: no run gains the other's sizes."""
    sizes = {"maze": {3: "id", 8: "ood"}, "sudoku4": {2: "id", 4: "id"}}
    rows = []
    for i, (task, lengths) in enumerate(sizes.items()):
        row = {"run_id": f"r{i}", "run_dir": f"runs/r{i}", "variant": "trm", "task.name": task, "run.seed": 200}
        for n, split in lengths.items():
            row.update({f"per_length.{n}.split": split, f"per_length.{n}.oracle": 0.5, f"per_length.{n}.policy": 0.4,
                        f"per_length.{n}.policy_depth": 4.0})  # fmt: skip
        rows.append(row)
    pd.DataFrame(rows).to_parquet(tmp_path / "results.parquet")
    collect([tmp_path], tmp_path / "out")
    found = pd.read_csv(tmp_path / "out" / "halting.csv")
    assert {task: sorted(part.length) for task, part in found.groupby("task")} == {"maze": [3, 8], "sudoku4": [2, 4]}
    assert found.split.notna().all()
