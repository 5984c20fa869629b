"""Test-time scaling to 128+ loops with divergence, and the analysis commands, through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import run_cli, train_tiny_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("stability"), 10, 10, "model.injection=none")[1]


def test_exploding_pre_norm_core_gives_complete_scaling_csv(run_dir, tmp_path):
    run_dir = Path(shutil.copytree(run_dir, tmp_path / "exploding"))
    weights = run_dir / "checkpoints" / "step_0000010" / "model.safetensors"
    tensors = load_file(weights)
    # A pre-norm layer adds f(N(x)) each loop; scaled up, the state overflows float32 within ~40 loops.
    tensors["core.0.mlp.2.weight"] = tensors["core.0.mlp.2.weight"] * 1e37
    tensors["core.0.mlp.2.bias"] = torch.full_like(tensors["core.0.mlp.2.bias"], 1e37)
    save_file(tensors, weights)

    result = run_cli("eval", str(run_dir), "--scaling", "--max-loops", "160", "--samples", "16", "--lengths", "4,6")
    assert result.returncode == 0, result.stderr
    out = run_dir / "eval" / "lengths4-6_loops160_samples16"
    curve = pd.read_csv(out / "scaling.csv")
    assert list(curve.columns) == ["loops", "accuracy", "state_norm", "step_norm", "nonfinite_fraction"]
    assert curve["loops"].tolist() == list(range(1, 161))
    assert curve["nonfinite_fraction"].iloc[0] == 0 and curve["nonfinite_fraction"].iloc[-1] == 1
    assert (curve.loc[curve["nonfinite_fraction"] == 1, "accuracy"] == 0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nonfinite_last"] == 1.0 and "128" in summary["scaling_at"]
    for key in ("scaling_peak", "scaling_peak_loops", "relative_drop"):
        assert key in summary
    assert (out / "scaling.png").stat().st_size > 1000


def test_analyze_spectral_and_pca(run_dir, tmp_path):
    result = run_cli(
        "analyze",
        "spectral",
        str(run_dir),
        "--loops",
        "3",
        "--samples",
        "2",
        "--exact-at",
        "all",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "exact eigenvalues: loop 1:" in result.stdout and "{" not in result.stdout
    frame = pd.read_csv(tmp_path / "spectral.csv")
    assert set(frame["loop"]) == {1, 2, 3} and len(frame) == 6
    assert {"rho_power", "rayleigh", "rho_exact"} <= set(frame.columns)
    assert (frame["rho_power"] > 0).all()
    # warm-started power iteration at 10 iterations per loop agrees with the exact spectrum
    assert frame["rho_power"].to_numpy() == pytest.approx(frame["rho_exact"].to_numpy(), rel=0.25)
    summary = json.loads((tmp_path / "spectral.json").read_text())
    assert set(summary["rho_exact"]) == {"1", "2", "3"}
    result = run_cli("analyze", "pca", str(run_dir), "--loops", "5", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "pca_2d.png").stat().st_size > 1000 and (tmp_path / "pca_3d.png").stat().st_size > 1000


def test_analyze_spectral_computes_the_exact_spectrum_at_three_loops_by_default(run_dir, tmp_path):
    result = run_cli("analyze", "spectral", str(run_dir), "--loops", "9", "--samples", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    frame = pd.read_csv(tmp_path / "spectral.csv")
    assert sorted(frame.dropna(subset=["rho_exact"])["loop"].unique()) == [1, 5, 9]
    assert frame["rho_power"].notna().all() and len(frame) == 18


@pytest.mark.parametrize(
    "exact_at, message",
    [("1,x", "--exact-at takes loops like"), ("0,3", "lie outside 1..3"), ("4", "lie outside 1..3")],
)
def test_analyze_spectral_refuses_bad_exact_loops(run_dir, tmp_path, exact_at, message):
    result = run_cli(
        "analyze", "spectral", str(run_dir), "--loops", "3", "--exact-at", exact_at, "--out", str(tmp_path / "x")
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists(), "a refused analysis created its output folder"
