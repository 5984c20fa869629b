"""Every kind of figure looplab draws, rendered through the commands that draw it and inspected: no two
text boxes overlap (titles, axis labels, tick labels inside the view, legends), and every axes that plots
data has x tick labels."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image

from looplab.cli import main
from looplab.plotting import DPI, figure_preset
from tests.conftest import train_tiny_run

SWEEP = "[sweep]\nconfigs = ['tiny.toml']\nseeds = [0, 1]\nset = ['train.steps=4']\n"
LM = ["task.train_max=4", "task.eval_lengths=[2,5]", "model.causal=true", "train.steps=2", "model.max_len=64"]


def _texts(fig: Figure) -> list[tuple[str, object]]:
    """(name, artist) of every text box that must not collide: tick labels only inside the axis' view."""
    found = []
    if fig._suptitle is not None and fig._suptitle.get_text():
        found.append(("suptitle", fig._suptitle))
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        for name, text in (("title", ax.title), ("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label)):
            if text.get_text() and text.get_visible():
                found.append((f"ax{i}.{name}", text))
        if ax.name == "3d" or not ax.axison:  # projected tick labels meet at the corners; no axis, no ticks
            continue
        for axis, name, coord in ((ax.xaxis, "xtick", 0), (ax.yaxis, "ytick", 1)):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * abs(high - low)
            for text in axis.get_ticklabels():
                inside = low - slack <= text.get_position()[coord] <= high + slack
                if text.get_text() and text.get_visible() and inside:
                    found.append((f"ax{i}.{name}", text))
    for i, ax in enumerate(fig.axes):
        if ax.get_visible() and ax.get_legend() is not None:
            found.append((f"ax{i}.legend", ax.get_legend()))
    return found


def figure_problems(fig: Figure, name: str) -> list[str]:
    """What a reader could not read in ``fig``: overlapping text, a data axes without x tick labels, and
    under a preset with fonts, text below its smallest size."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = _texts(fig)
    problems = []
    preset = figure_preset()
    if preset.widths is not None:  # saved at its own size: small text, or text past the edge, is lost
        canvas = fig.bbox
        drawn = [artist for _, artist in found if isinstance(artist, Text)] + list(fig.texts)
        drawn += [text for ax in fig.axes for text in ax.texts]
        drawn += [text for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts()]
        for text in drawn:
            if not (text.get_visible() and text.get_text()):
                continue
            if text.get_fontsize() < preset.fonts["font.size"] - 1e-9:
                problems.append(f"{name}: {text.get_text()!r} at {text.get_fontsize():.1f} pt")
            box = text.get_window_extent(renderer)
            if box.x0 < canvas.x0 - 1 or box.x1 > canvas.x1 + 1 or box.y0 < canvas.y0 - 1 or box.y1 > canvas.y1 + 1:
                problems.append(f"{name}: {text.get_text()!r} runs off the figure")
    boxes = [(label, artist.get_window_extent(renderer)) for label, artist in found]
    for (first, a), (second, b) in itertools.combinations(boxes, 2):
        same_axis_ticks = first == second and first.endswith("tick")
        if same_axis_ticks or a.width * a.height == 0 or b.width * b.height == 0:
            continue
        overlap = a.intersection(a, b)
        if overlap is not None and overlap.width > 1 and overlap.height > 1:
            problems.append(f"{name}: {first} overlaps {second}")
    for i, ax in enumerate(fig.axes):
        colorbar = getattr(ax, "_colorbar", None) is not None
        plots_data = ax.lines or ax.collections or ax.images
        if ax.get_visible() and ax.axison and plots_data and not colorbar:
            if ax.name != "3d" and not any(label == f"ax{i}.xtick" for label, _ in found):
                problems.append(f"{name}: ax{i} has no x tick labels")
    return problems


@pytest.fixture
def inspected(monkeypatch):
    """Inspect every figure as it is saved; returns {figure file stem: its problems}."""
    seen: dict[str, list[str]] = {}
    save = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        stem = Path(str(fname)).stem.removeprefix(".tmp_")
        if Path(str(fname)).suffix == ".png" or stem not in seen:
            seen[stem] = figure_problems(self, stem)
        return save(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


@pytest.mark.parametrize("figsize", ["screen", "paper"])
def test_every_figure_of_the_commands_is_readable(tmp_path, inspected, figsize):
    config, run_dir = train_tiny_run(tmp_path, 6, 3)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    lm_run = tmp_path / "lm"
    lm_sets = [f"--set={s}" for s in ["task.name=kjv_arithmetic", *LM]]
    size = ["--figsize", figsize]
    commands = [
        ["eval", str(run_dir), "--scaling", *size],
        ["analyze", str(run_dir), "--loops", "12", "--samples", "2", *size],
        ["analyze", "spectral", str(run_dir), "--loops", "8", *size],
        ["analyze", "pca", str(run_dir), "--loops", "8", *size],
        ["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "sweep"), "--no-progress"],
        ["report", str(tmp_path / "sweep"), "--paper", "stopping", *size],
        ["train", str(config), "--out", str(lm_run), "--no-progress", *lm_sets],
        ["eval", str(lm_run), "--lm-loops", "6", "--samples", "8", *size],
    ]
    for command in commands:
        assert main(command) == 0, command
    kinds = {
        "scaling",
        "convergence",
        "cosine_matrix",
        "attention_difference",
        "spectral",
        "lm_loops",
        "lm_scaling",
    }
    assert kinds <= set(inspected), sorted(inspected)
    assert any(stem.endswith("-accuracy") for stem in inspected), sorted(inspected)
    assert [problem for problems in inspected.values() for problem in problems] == []
    if figsize == "paper":  # saved at one or two paper columns, so a figure is included unscaled
        drawn = [*run_dir.glob("eval/*.png"), *run_dir.glob("analysis/**/*.png"), *lm_run.glob("eval/*.png")]
        drawn += [*(tmp_path / "sweep" / "report-stopping").glob("*.png")]
        assert len(drawn) >= 10
        for png in drawn:
            width = Image.open(png).size[0]
            assert any(abs(width - DPI * inches) <= 2 for inches in (3.25, 6.75)), (png.name, width)


def test_the_stars_curves_keep_many_long_recipes_readable_and_name_their_bands(tmp_path, inspected):
    from looplab.studies.stars.lm import plot_curves

    loops = np.arange(1, 65)
    recipes = ["fixed4", "stars", "contractive", "pretrain", "pretrain+model.injection=contractive", "other"]
    curves = pd.concat(
        pd.DataFrame(
            {
                "loops": loops,
                "reasoning_id": np.exp(-loops / (10 + rank + seed)),
                "reasoning_ood": np.exp(-loops / (5 + rank)),
                "loss": 2 + np.log(loops) * rank / 4,
                "state_norm": 8 + loops / 1000,
                "shape": shape,
                "recipe": recipe,
                "seed": seed,
            }
        )
        for shape in ("post_sandwich", "pre_sandwich")
        for rank, recipe in enumerate(recipes)
        for seed in (0, 1)
    )
    captured = []
    save = Figure.savefig

    def keep(self, fname, *args, **kwargs):
        captured.append(self)
        return save(self, fname, *args, **kwargs)

    Figure.savefig = keep  # inside the fixture's patch, which monkeypatch restores
    plot_curves(curves, tmp_path / "curves.png", "looped LMs")
    assert inspected["curves"] == []
    legend = next(ax.get_legend() for ax in captured[0].axes if ax.get_legend() is not None)
    assert legend.get_title().get_text() == "bands: ±1 SD over seeds"
    assert all("(2 seeds)" in text.get_text() for text in legend.get_texts())
    colours = {line.get_label(): line.get_color() for line in captured[0].axes[0].lines if line.get_label()[0] != "_"}
    assert len(set(colours.values())) == len(recipes), colours  # one colour per recipe


def test_the_analysis_heatmaps_print_and_scale_what_they_colour(tmp_path, monkeypatch):
    import torch

    from looplab.analysis.plots import plot_attention_difference, plot_cosine_matrix

    captured = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (captured.append(self), save(self, *a, **k))[1])
    cos = torch.tensor([[1.0, 1 - 3e-9, 0.9], [1 - 3e-9, 1.0, 0.9], [0.9, 0.9, 1.0]], dtype=torch.float64)
    plot_cosine_matrix(cos, tmp_path / "cos.png")
    cells = sorted(text.get_text() for text in captured[0].axes[0].texts)
    assert cells == ["1e-01"] * 4 + ["3e-09"] * 2  # 1 − cos, as coloured; a cos would print 1.0000
    loops = torch.arange(1, 7, dtype=torch.float64)
    diff = (loops[:, None] - loops[None, :]).abs()[None] / 100
    diff[0, 0, 1:] = diff[0, 1:, 0] = 5.0  # loop 1 far from every other loop
    plot_attention_difference(diff, tmp_path / "attention.png")
    image = captured[-1].axes[0].images[0]  # each figure is saved twice (PNG, PDF)
    assert image.norm.vmax == pytest.approx(0.04)  # the later loops' range, not loop 1's 5.0


def test_both_colsum_figures_draw_one_legend(tmp_path, monkeypatch):
    import torch

    from looplab.analysis.plots import plot_colsum_depth
    from looplab.text.pretrained import FeedForwardStages, plot_feedforward_stages

    captured = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (captured.append(self), save(self, *a, **k))[1])
    heads = torch.rand(6, 9, generator=torch.Generator().manual_seed(0))
    stages = FeedForwardStages(colsum_heads=heads, colsum=heads.mean(-1), massive=torch.ones(7), tokens=10)
    plot_feedforward_stages(stages, tmp_path / "ff")
    labels = ["prelude0", *(f"loop{t}.core{i}" for t in (1, 2) for i in (0, 1)), "coda0"]
    plot_colsum_depth(heads, labels, tmp_path / "looped.png")
    legends = [[t.get_text() for t in fig.axes[0].get_legend().get_texts()] for fig in (captured[0], captured[-1])]
    assert legends == [["each head", "mean over heads"]] * 2  # nine heads, one legend entry for them
