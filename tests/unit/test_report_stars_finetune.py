"""The stars-finetune study's decision rules and blocks (looplab/studies/stars/finetune.py)."""

import numpy as np
import pandas as pd
import pytest

from looplab.studies.stars.finetune import (
    CURVE_COLUMNS,
    READ_LOOPS,
    arm_name,
    decision_lines,
    exact_match_block,
    loss_line,
    rho_line,
)


def _runs(em32: dict[str, list[float]], placement: str = "post_sandwich", extra: dict | None = None) -> pd.DataFrame:
    """Rows of runs.csv: exact match ``em32`` per arm at 8, 32 and 64 loops; ``extra`` {arm: {column: values}}."""
    rows = []
    for arm, values in em32.items():
        for seed, value in enumerate(values):
            row = {"placement": placement, "arm": arm, "seed": 600 + seed, "status": "done", "step_s": 0.1}
            row.update({f"{name}_{k}": np.nan for name in CURVE_COLUMNS.values() for k in READ_LOOPS})
            row.update({"em_32": value, "em_8": value, "em_64": value})
            row.update({key: v[seed] for key, v in (extra or {}).get(arm, {}).items()})
            rows.append(row)
    return pd.DataFrame(rows)


def _line(lines, start):
    return next(line for line in lines if line.startswith(start))


@pytest.mark.parametrize(
    "stars, lognormal, verdict",
    [
        ([0.6, 0.62, 0.61, 0.63, 0.6], [0.4, 0.42, 0.41, 0.39, 0.4], "adds"),
        ([0.4, 0.42, 0.41, 0.39, 0.4], [0.6, 0.62, 0.61, 0.63, 0.6], "hurts"),
        ([0.5, 0.7, 0.3, 0.6, 0.4], [0.45, 0.65, 0.35, 0.55, 0.5], "not resolved"),
    ],
)
def test_jsrr_with_random_loops_reads_exact_match_at_32_loops(stars, lognormal, verdict):
    lines = decision_lines(_runs({"stars": stars, "lognormal": lognormal}))
    line = _line(lines, "JSRR with random loops")
    assert "exact match at 32 loops" in line and line.endswith(verdict)
    assert "n/a" in _line(lines, "JSRR alone")  # no fixed4 arms here: undefined, not 0


@pytest.mark.parametrize(
    "rho, verdict",
    [
        ([0.9, 0.92, 0.91, 0.93, 0.9], "below 1"),
        ([1.1, 1.12, 1.11, 1.13, 1.1], "above 1"),
        ([0.9, 1.1, 0.95, 1.05, 1.0], "not resolved"),
    ],
)
def test_rho_is_judged_against_one_by_its_t_interval(rho, verdict):
    line = rho_line("stars", 4, np.array(rho))
    assert line.endswith(verdict) and f"{sum(r < 1 for r in rho)} of 5 seeds below 1" in line
    assert "n/a" in rho_line("stars", 4, np.array([0.9]))


def test_placement_compares_the_same_arm_across_placements_and_loss_the_right_way_round():
    post = _runs({"stars": [0.8, 0.82, 0.81, 0.83, 0.8]}, extra={"stars": {"loss_64": [2.0, 2.01, 2.02, 2.0, 2.01]}})
    pre = _runs(
        {"stars": [0.4, 0.42, 0.41, 0.43, 0.4]}, "pre_sandwich", {"stars": {"loss_64": [3.0, 3.01, 3.02, 3.0, 3.01]}}
    )
    lines = decision_lines(pd.concat([post, pre]))
    assert _line(lines, "placement, stars: post − pre").endswith("post holds more")
    # pre's higher loss means post-sandwich predicts better
    assert _line(lines, "placement, stars: pre − post, KJV loss").endswith("post holds more")
    assert "n/a" in loss_line("q", np.array([3.0]), np.array([2.0, 2.1]), 64)


def test_pretrained_runs_are_named_by_their_shape():
    plain = pd.Series({"model.prelude_layers": 0, "model.injection": "none"})
    assert arm_name("pretrain", plain) == "pretrain"
    assert arm_name("pretrain+model.injection=contractive", plain.replace("none", "contractive")) == (
        "pretrain (contractive)"
    )
    assert arm_name("pretrain+model.prelude_layers=1", pd.Series({"model.prelude_layers": 1})) == (
        "pretrain (prelude_coda)"
    )
    assert arm_name("post_sandwich-fixed4_jsrr", plain) == "fixed4_jsrr"


def test_the_exact_match_block_ranks_arms_at_32_loops_and_shows_missing_values_as_na(tmp_path):
    runs = _runs({"lognormal": [0.4, 0.41, 0.42], "stars": [0.6, 0.61, 0.62], "pretrain": [0.9, 0.9, 0.91]})
    (tmp_path / "stars-finetune").mkdir()
    runs.to_csv(tmp_path / "stars-finetune" / "runs.csv", index=False)
    block = exact_match_block(tmp_path)
    arms = [line.split("|")[2].strip() for line in block.splitlines()[2:]]
    assert arms == ["stars", "lognormal", "pretrain"]  # by exact match at 32 loops, pretrained runs last
    assert "n/a (0 seeds)" in block  # em at 4 loops was never measured here
