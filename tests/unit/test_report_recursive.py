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


def _confirm(tmp_path, on, off, depth=5.0):
    """recursive-confirm and recursive-small runs.csv: act_bce_detached with halting ``on`` / ``off`` per seed."""
    columns = {"on_id_depth": depth, "on_seconds": 1.0, "off_seconds": 2.0, "train_loops_per_row": 7.0,
               "oracle_id": 0.7, "policy_ood": 0.1}  # fmt: skip
    rows = [
        {"arm": "act_bce_detached", "seed": 400 + i, "policy_id": a, "on_id": a, "off_id": b, **columns}
        for i, (a, b) in enumerate(zip(on, off))
    ]
    for arm, value in (("ds_fixed", 0.7), ("act_bce", 0.35), ("q_halt", 0.4), ("q_halt_detached", 0.7)):
        rows += [{"arm": arm, "seed": 400 + i, "policy_id": value + i / 100, "on_id": value, "off_id": value,
                  **columns, "train_loops_per_row": 8.0} for i in range(len(on))]  # fmt: skip
    for study in ("recursive-confirm", "recursive-small"):
        (tmp_path / study).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / study / "runs.csv", index=False)
    return tmp_path


def test_the_halting_sentence_names_the_rule_boundary_its_interval_lies_nearest(tmp_path):
    from looplab.studies.recursive.pages import says_halting

    on, off = [0.70, 0.69, 0.70, 0.695, 0.70], [0.70, 0.70, 0.70, 0.70, 0.70]
    text = says_halting(_confirm(tmp_path, on, off))
    assert text.startswith("**Halting on − off, act_bce_detached: halting is free.**")
    assert "nearest a boundary of the rule is the upper end, +0.2" in text and "against 0" in text
    assert "2 of 5 lose accuracy (0.50–1.00 pp), 3 of 5 neither lose nor gain, 0 of 5 gain" in text
    assert "wall time off / on 2.00x" in text


def test_depth_intervals_are_clipped_to_the_loops_a_row_can_run(tmp_path):
    from looplab.studies.recursive.pages import DEPTH_RANGE, arms_table

    results = _confirm(tmp_path, [0.7] * 5, [0.7] * 5)
    frame = pd.read_csv(results / "recursive-confirm" / "runs.csv")
    frame.loc[frame.arm == "q_halt", "on_id_depth"] = [8.0, 8.0, 6.5, 8.0, 8.0]  # a t-interval reaching past 8
    frame.to_csv(results / "recursive-confirm" / "runs.csv", index=False)
    row = next(line for line in arms_table(results, "recursive-confirm").splitlines() if line.startswith("| q_halt |"))
    assert DEPTH_RANGE == (1.0, 8.0) and "7.70 ± 0.67 [6.87, 8.00]" in row


def test_the_paired_reading_keeps_the_rule_and_its_numbers(tmp_path):
    from looplab.studies.recursive.paper import halting_on_off

    frame = pd.DataFrame(
        {
            "variant": "a",
            "run.seed": range(5),
            "halting_inference.on_id": [0.5, 0.49, 0.5, 0.5, 0.48],
            "halting_inference.off_id": [0.5] * 5,
            "halting_inference.on_id_depth": 4.0,
            "halting_inference.on_seconds": 1.0,
            "halting_inference.off_seconds": 3.0,
        }
    )
    paired = halting_on_off(frame, "a")
    # on − off: 0, −1, 0, 0, −2 pp; mean −0.6 pp, t-interval [−1.71, +0.51] pp: inside ±2 pp
    assert paired.verdict == "halting is free" and paired.difference.mean() == pytest.approx(-0.006)
    assert (paired.low, paired.high) == pytest.approx((-0.0171, 0.0051), abs=1e-4)
    assert paired.depth == 4.0 and paired.time_ratio == pytest.approx(3.0)
    assert halting_on_off(frame.head(1), "a") is None


def test_holm_adjusts_the_recursive_decisions_as_computed_by_hand(tmp_path):
    """Five decisions with p (sorted) 0.001, 0.004, 0.02, 0.3, 0.5: Holm multiplies by 5, 4, 3, 2, 1 and keeps
    the running maximum (0.005, 0.016, 0.06, 0.6, 0.6), so the third rejection is lost."""
    from looplab.report.effect import holm

    adjusted, rejected = holm([0.02, 0.5, 0.001, 0.3, 0.004])
    assert np.allclose(adjusted, [0.06, 0.6, 0.005, 0.6, 0.016])
    assert rejected.tolist() == [False, False, True, False, True]


def test_a_decision_holm_cannot_keep_reads_not_resolved(tmp_path):
    """recursive-confirm's five decisions: the matched comparisons resolved by the rule, Holm's verdict the rule's
    only where the adjusted p is below α, and the adjusted p the hand-computed step-down of the decisions' p."""
    from looplab.report.effect import ALPHA
    from looplab.studies.recursive.verdicts import decisions

    on = [0.70, 0.69, 0.71, 0.70, 0.705]
    found = decisions(_confirm(tmp_path, on, [v + 0.002 for v in on]), "recursive-confirm")
    assert len(found) == 5
    p = np.array([d.p for d in found])
    order = np.argsort(p)
    by_hand = np.maximum.accumulate(np.minimum(1.0, (5 - np.arange(5)) * p[order]))
    assert np.allclose(np.array([d.holm_p for d in found])[order], by_hand)
    for d in found:
        assert d.holm_verdict == (d.verdict if d.holm_p < ALPHA else "not resolved")


@pytest.mark.parametrize("seed", range(40))
def test_the_p_values_decide_exactly_as_the_frozen_rules(seed):
    """Random seed rows near every rule's lines: each decision's p is below α exactly when its rule resolves it,
    and the p-values' verdict is the rule's (decisions() raises otherwise)."""
    from looplab.report.effect import ALPHA
    from looplab.studies.recursive.paper import CONFIRM_COMPARISONS, CONFIRM_MATCHES, CONFIRM_PAIRED
    from looplab.studies.recursive.verdicts import UNRESOLVED, _comparison, _paired

    rng = np.random.default_rng(seed)
    base = rng.uniform(0.3, 0.7)
    arms = {
        "ds_fixed": base + rng.normal(0, 0.02, 5),
        "act_bce": base + rng.uniform(-0.1, 0.1) + rng.normal(0, 0.03, 5),
    }
    off = base + rng.normal(0, 0.02, 5)
    on = off + rng.uniform(-0.03, 0.03) + rng.normal(0, 0.01, 5)
    arms["act_bce_detached"] = on
    frame = _runs({k: list(v) for k, v in arms.items()}, {"act_bce_detached": (list(on), list(off))})
    lines = decision_lines(frame, CONFIRM_COMPARISONS[:1], CONFIRM_PAIRED, CONFIRM_MATCHES[:1])
    tested = [
        _comparison(frame, "act_bce_detached", "act_bce", "helps", "hurts", None),
        _comparison(frame, "act_bce_detached", "ds_fixed", "better", "worse", 5.0),
        _paired(frame, "act_bce_detached"),
    ]
    for line, (verdict, tests) in zip(lines, tested):
        assert line.split("): ")[-1].split("; ")[0] == verdict
        assert (min(tests.values()) < ALPHA) == (verdict != UNRESOLVED)


def test_the_committed_pages_holm_verdicts(tmp_path):
    """On the committed CSVs: Holm keeps recursive-confirm's verdicts, and changes recursive-small's act_bce
    halting reading and the maze page's deep supervision and act_bce halting readings to "not resolved"."""
    from pathlib import Path

    from looplab.studies.recursive.verdicts import decisions, line_name

    results = Path(__file__).parents[2] / "docs" / "results"
    changed = {
        study: [line_name(d.line) for d in decisions(results, study) if d.holm_verdict != d.verdict]
        for study in ("recursive-confirm", "recursive-small", "recursive-maze")
    }
    assert changed == {
        "recursive-confirm": [],
        "recursive-small": ["halting on − off, act_bce"],
        "recursive-maze": [
            "mazes, deep supervision at a matched depth: ds_fixed − fixed",
            "mazes, halting on − off, act_bce",
        ],
    }
