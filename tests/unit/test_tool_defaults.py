"""The defaults of the tools on a model dir at any size (looplab/text/compute.py): the usual windows on a
small model, fewer on a large one, at least one; the exact spectrum by default only where it is cheap beside
the power iteration; and the time each prints before it starts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from looplab.stability.spectral import power_products  # noqa: E402
from looplab.text.compute import DEFAULT_FLOPS, budgeted_windows, pass_flops  # noqa: E402
from looplab.text.model_dir_analyses import analyze_text_spectral  # noqa: E402
from looplab.text.model_dirs import evaluate_text  # noqa: E402
from tests.lm_dirs import TEXT, save_own_family  # noqa: E402


@pytest.mark.parametrize(
    ("parameters", "window", "passes", "usual", "expected"),
    [
        (10**6, 64, 100, 8, 8),  # a small model: the usual count
        (1_430_000_000, 256, 16, 64, int(DEFAULT_FLOPS // (2 * 1_430_000_000 * 256 * 16))),  # Ouro-1.4B's eval
        (10**12, 64, 1000, 4, 1),  # past the budget in one window: still one
    ],
)
def test_default_windows_shrink_with_the_model_and_keep_one(parameters, window, passes, usual, expected):
    assert budgeted_windows(parameters, window, passes, usual) == expected
    assert 1 <= expected <= usual
    assert pass_flops(parameters, window) == 2.0 * parameters * window


def test_the_power_iteration_counts_its_products():
    """4 × iters from the random start at loop 1, iters after, and a Rayleigh product every loop."""
    assert power_products(1, 10) == 41 and power_products(8, 10) == 41 + 7 * 11


@pytest.fixture(scope="module")
def ouro(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool_defaults")
    (root / "text.txt").write_text(TEXT * 8, encoding="utf-8")
    return save_own_family("ouro", root / "ouro"), root / "text.txt"


@pytest.mark.parametrize(("window", "exact"), [(2, True), (16, False)])
def test_the_exact_spectrum_is_taken_by_default_only_where_it_is_cheap(ouro, tmp_path, window, exact, capsys):
    """A window's L·d Jacobian columns against the power iteration's products (6 loops, 10 iterations: 96):
    2 × 32 = 64 columns are cheap, 16 × 32 = 512 are not."""
    path, text = ouro
    summary = analyze_text_spectral(path, text, window=window, samples=1, out=tmp_path / "spec", progress=True)
    assert bool(summary["rho_exact"]) == exact
    assert json.loads((tmp_path / "spec" / "spectral.json").read_text())["loops"] == 6  # 2 × native 3
    said = capsys.readouterr().out
    assert "analyze spectral:" in said and " here (" in said and "GFLOP/s measured)" in said


def test_eval_says_how_long_it_will_take_before_it_starts(ouro, tmp_path, capsys):
    path, text = ouro
    summary = evaluate_text(path, text, max_loops=2, window=8, out=tmp_path / "eval", progress=True)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("eval: ") and "windows of 8 tokens" in first and "about " in first
    assert summary["windows"] > 1  # a tiny model reads the usual windows the text holds
