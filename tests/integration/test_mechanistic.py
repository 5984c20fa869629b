"""The mechanistic analysis end to end on a tiny trained run."""

from __future__ import annotations

import csv
import json
import math

from looplab.analysis.mechanistic import analyze_mechanistic
from tests.conftest import run_cli, train_tiny_run

FILES = ["summary.json", "convergence.csv", "fixed_points.csv", "layer_cosines.csv", "colsum.csv", "attention.csv",
         "massive.csv", "convergence.png", "cosine_matrix.png", "attention_difference.png", "colsum_depth.png"]


def test_analyze_mechanistic_writes_files_and_summary(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 5, 5, "model.core_layers=2")
    summary = analyze_mechanistic(run_dir, loops=6, samples=2)
    out = run_dir / "analysis" / "mechanistic"
    for name in FILES:
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "summary.json").read_text()) == summary
    for key in ("fixed_point_self_cos", "fixed_point_cross_cos_min", "attention_diff_last", "colsum",
                "token_dynamics"):
        assert key in summary
    assert -1 - 1e-6 <= summary["fixed_point_self_cos"] <= 1 + 1e-6
    assert -1 - 1e-6 <= summary["fixed_point_cross_cos_min"] <= 1 + 1e-6
    assert math.isfinite(summary["attention_diff_last"]) and summary["attention_diff_last"] >= 0
    assert 0 <= summary["colsum"]["mean"] <= 1
    assert math.isclose(sum(summary["token_dynamics"][k] for k in ("fixed_point", "orbit", "slider")), 1.0)
    assert summary["lipschitz"]["holds_fraction"] >= 0.95   # exact in float64 (unit test); float32 here
    with (out / "convergence.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 5 and all(math.isfinite(float(r["delta"])) for r in rows)


def test_analyze_cli_short_form_runs_the_mechanistic_analysis(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 5, 5, "model.core_layers=2")
    result = run_cli("analyze", str(run_dir), "--loops", "4", "--samples", "2", "--out", str(tmp_path / "mech"))
    assert result.returncode == 0, result.stderr
    assert "fixed_point_self_cos" in result.stdout
    assert json.loads((tmp_path / "mech" / "summary.json").read_text())["loops"] == 4
    bad = run_cli("analyze", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "not found" in bad.stderr and "Traceback" not in bad.stderr
