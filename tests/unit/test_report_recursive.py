"""The recursive-reasoner report's decision rules (looplab/report/recursive.py)."""

import numpy as np
import pandas as pd
import pytest

from looplab.report.recursive import decision_lines


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
    from looplab.report.recursive import CONFIRM_COMPARISONS, CONFIRM_MATCHES, CONFIRM_PAIRED

    runs = _runs({"act_bce_detached": detached, "ds_fixed": none, "act_bce": [0.3, 0.35, 0.4, 0.32, 0.38]})
    lines = decision_lines(runs, CONFIRM_COMPARISONS, CONFIRM_PAIRED, CONFIRM_MATCHES)
    assert _line(lines, "a detached head against no head: act_bce_detached − ds_fixed").endswith(verdict)
    assert _line(lines, "detaching the head: act_bce_detached − act_bce").endswith("helps")
    assert "q_halt_detached vs q_halt: n/a (0 and 0 seeds" in _line(lines, "detaching the head: q_halt_detached")
