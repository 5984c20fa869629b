"""The mechanistic analysis end to end on a tiny trained run."""

from __future__ import annotations

import csv
import json
import math

from looplab.analysis.mechanistic import analyze_mechanistic
from tests.conftest import run_cli, train_tiny_run

FILES = [
    "summary.json",
    "convergence.csv",
    "fixed_points.csv",
    "layer_cosines.csv",
    "colsum.csv",
    "attention.csv",
    "massive.csv",
    "convergence.png",
    "cosine_matrix.png",
    "attention_difference.png",
    "colsum_depth.png",
]


def test_analyze_mechanistic_writes_files_and_summary(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 5, 5, "model.core_layers=2")
    summary = analyze_mechanistic(run_dir, loops=6, samples=2)
    out = run_dir / "analysis" / "mechanistic"
    for name in FILES:
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "summary.json").read_text()) == summary
    for key in ("fixed_point_self_cos", "fixed_point_cross_cos_min", "attention_diff_last", "colsum", "token_dynamics"):
        assert key in summary
    assert -1 - 1e-6 <= summary["fixed_point_self_cos"] <= 1 + 1e-6
    assert -1 - 1e-6 <= summary["fixed_point_cross_cos_min"] <= 1 + 1e-6
    assert math.isfinite(summary["attention_diff_last"]) and summary["attention_diff_last"] >= 0
    assert 0 <= summary["colsum"]["mean"] <= 1
    assert math.isclose(sum(summary["token_dynamics"][k] for k in ("fixed_point", "orbit", "slider")), 1.0)
    assert summary["lipschitz"]["holds_fraction"] >= 0.95  # exact in float64 (unit test); float32 here
    with (out / "convergence.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 5 and all(math.isfinite(float(r["delta"])) for r in rows)


def test_analyze_cli_short_form_runs_the_mechanistic_analysis(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 5, 5, "model.core_layers=2")
    result = run_cli("analyze", str(run_dir), "--loops", "4", "--samples", "2", "--out", str(tmp_path / "mech"))
    assert result.returncode == 0, result.stderr
    assert "fixed points: first layer's cosine to its own final state" in result.stdout
    assert "% at a fixed point" in result.stdout and "{" not in result.stdout  # readable lines, not JSON
    assert json.loads((tmp_path / "mech" / "summary.json").read_text())["loops"] == 4
    bad = run_cli("analyze", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "not found" in bad.stderr and "Traceback" not in bad.stderr


def test_untrained_run_and_config_analysis_agree(tmp_path):
    """train.steps = 0 keeps the seeded initialisation; analysing the config directly gives the same numbers."""
    config, run_dir = train_tiny_run(
        tmp_path,
        0,
        5,
        "model.core_layers=3",
        "model.init_std=0.05",
        "model.embed_std=1.0",
        'model.injection="concat"',
        'model.inject_init="random"',
    )
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_0000000"]
    from_run = analyze_mechanistic(run_dir, loops=8, samples=2, mlp_ablation=False)
    sets = [
        "model.core_layers=3",
        "model.init_std=0.05",
        "model.embed_std=1.0",
        'model.injection="concat"',
        'model.inject_init="random"',
        "train.steps=0",
    ]
    result = run_cli(
        "analyze",
        str(config),
        "--loops",
        "8",
        "--samples",
        "2",
        "--no-mlp-ablation",
        "--out",
        str(tmp_path / "init"),
        *[a for s in sets for a in ("--set", s)],
    )
    assert result.returncode == 0, result.stderr
    from_config = json.loads((tmp_path / "init" / "summary.json").read_text())
    assert from_run["steps_trained"] == 0 and from_config["checkpoint"] is None
    for key in (
        "fixed_point_self_cos",
        "fixed_point_self_cos_median",
        "fixed_point_cross_cos_min",
        "state_norm_first",
        "state_norm_last",
        "update_ratio_mean",
    ):
        assert from_config[key] == from_run[key], key
    assert from_run["colsum"]["mlp_ablation"] == []
    assert len(from_run["update_ratio_last"]) == 2 and from_run["update_ratio_mean"] > 0


def test_analyze_config_errors(tmp_path, tiny_config):
    config = tiny_config()
    for args, message in [
        ((str(config),), "needs --out"),
        ((str(config), "--out", str(tmp_path / "o"), "--set", 'model.norm="bogus"'), "model.norm"),
        ((str(tmp_path), "--set", "model.d_model=8"), "--set applies to a config file"),
    ]:
        result = run_cli("analyze", *args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, args
    assert not (tmp_path / "o").exists()


def test_zero_mlp_option_is_the_analysis_of_the_ablated_model(tmp_path):
    """--zero-mlp core1 gives what analysing the model with that MLP zeroed by hand gives, and differs
    from the intact model's analysis; the summary names the zeroed MLP."""
    from looplab.analysis.massive import zero_mlp
    from looplab.analysis.mechanistic import analyze_experiment
    from looplab.experiment import Experiment

    _, run_dir = train_tiny_run(tmp_path, 0, 5, "model.core_layers=2")
    options = dict(loops=4, samples=2, mlp_ablation=False, metrics=["fixed_points", "colsum"], plots=False)
    zeroed = analyze_mechanistic(run_dir, out=tmp_path / "zeroed", zero_mlp="core1", **options)
    intact = analyze_mechanistic(run_dir, out=tmp_path / "intact", **options)
    exp = Experiment.from_run(run_dir)
    with zero_mlp(exp.model, "core1"):
        by_hand = analyze_experiment(exp, tmp_path / "by_hand", **options)
    assert zeroed["zero_mlp"] == "core1" and "zero_mlp" not in intact
    assert zeroed["state_norm_last"] == by_hand["state_norm_last"] != intact["state_norm_last"]
    assert zeroed["colsum"]["mean"] == by_hand["colsum"]["mean"]
    assert not any((tmp_path / "zeroed").glob("*.png"))
