"""Figures of a sweep, one PNG (and a PDF beside it) per (task, kind), in looplab's one figure style.

Every figure is over seeds: a line is the mean over a variant's runs, a band
mean ± std (sample std; no band for one seed), and the legend says so and how
many seeds each line has. Each variant keeps its schedule's colour in every
figure; ID and OOD lengths are neutral greys. Inputs are the stacked per-run frames of
:mod:`looplab.report.runs`; a figure whose input is empty is skipped.
``train_depths`` (variant → the largest depth it trains at) marks the training
depth where the x axis is loops. :data:`CAPTIONS` says what each figure shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.plotting import SPARE_COLORS, color_for, pyplot, save_figure
from looplab.report.runs import scaling_curves

DPI = 100
PANEL_COLUMNS = 4
BAND_LABEL = "bands: ±1 SD over seeds"
#: training (ID) and longer (OOD) lengths in neutral tones, never a schedule's colour
SPLIT_COLORS = {"id": "0.35", "ood": "0.7", "all": "0.5"}
#: at most this many evaluated lengths get a tick each
MAX_LENGTH_TICKS = 16


def _save(fig, path: Path) -> None:
    save_figure(fig, path)


CAPTIONS = {
    "accuracy": "acc(n, K): the share of samples of length n answered exactly after K loops, mean over seeds, "
    "one panel per variant. Dashed white line: the train | OOD boundary; dotted white line: the variant's "
    "training depth.",
    "oracle": "Oracle(n) = max over K of acc(n, K) against the length n, per variant: the line is the mean over "
    "seeds, the band mean ± one sample std over seeds. Dotted grey line: the train | OOD boundary.",
    "flips": "Flip rate: the share of OOD samples whose answer after K + 1 loops differs from after K, mean over "
    "seeds with a mean ± std band. Dashed lines: each variant's training depth.",
    "depths": "The schedule's own test-time depth: share of samples at each depth, training (ID, dark grey) and "
    "longer (OOD, light grey) lengths apart, summed over seeds; one panel per variant, on shared axes. "
    "Dashed line: the variant's training depth.",
    "scaling": "Test-time scaling: accuracy pooled over the evaluated lengths against the loops the runs were "
    "evaluated at, mean ± std over seeds. Dashed lines: each variant's training depth.",
}


def _panels(count: int, title: str, width: float = 3.6, height: float = 3.0, share: bool = False):
    """A figure with ``count`` panels in rows of PANEL_COLUMNS; returns (figure, the used axes)."""
    plt = pyplot()
    columns = min(count, PANEL_COLUMNS)
    rows = -(-count // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(width * columns + 1, height * rows + 0.6),
        squeeze=False,
        layout="constrained",
        sharex=share,
        sharey=share,
    )
    axes = list(axes.flat)
    for axis in axes[count:]:
        axis.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:count]


def _seed_band(axis, frame: pd.DataFrame, x: str, y: str, label: str, color: str) -> None:
    """Mean of ``y`` over runs against ``x`` in percent, with a mean ± std band; the legend names n."""
    stats = frame.groupby(x)[y].agg(["mean", "std"]).sort_index()
    mean, std = 100 * stats["mean"], 100 * stats["std"]
    runs = frame["run_id"].nunique() if "run_id" in frame else None
    if runs is not None:
        label = f"{label} ({runs} seed{'s' * (runs != 1)})"
    axis.plot(stats.index, mean, color=color, label=label, marker="o", markersize=2.5)
    _integer_ticks(axis)
    if std.notna().any():
        axis.fill_between(
            stats.index, (mean - std).clip(lower=0), (mean + std).clip(upper=100), color=color, alpha=0.2, linewidth=0
        )


def _legend(axis, **kwargs) -> None:
    """The axes' legend, titled with what its bands are."""
    axis.legend(title=BAND_LABEL, fontsize="small", title_fontsize="small", **kwargs)


def _integer_ticks(axis) -> None:
    """Lengths, loops and depths are integers: no 2.5-loop ticks."""
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def _split_boundary(splits: pd.DataFrame) -> float | None:
    """Midpoint between the longest training length and the shortest OOD length (None if either is absent)."""
    id_lengths = splits.loc[splits["split"] == "id", "length"]
    ood_lengths = splits.loc[splits["split"] == "ood", "length"]
    if id_lengths.empty or ood_lengths.empty:
        return None
    return (float(id_lengths.max()) + float(ood_lengths.min())) / 2


def _colors(variants) -> dict[str, str]:
    """Each variant in its schedule's colour, the same in every figure; a second variant of one schedule
    (``rl_halting-ent0`` beside ``rl_halting``) takes a spare colour no variant of the figure uses."""
    variants = sorted(map(str, variants))
    wanted = {v: color_for(v, variants) for v in variants}
    spare = iter(c for c in SPARE_COLORS if c not in wanted.values())
    colors: dict[str, str] = {}
    for variant in variants:  # sorted, so the schedule's own name comes before its ablations
        color = wanted[variant]
        colors[variant] = next(spare, color) if color in colors.values() else color
    return colors


def _mark_depths(axis, train_depths: dict, variants, colors: dict | None = None) -> None:
    """A vertical line at each variant's training depth (white on heatmaps, the variant's colour on curves)."""
    low, high = sorted(axis.get_xlim())
    for variant in variants:
        depth = train_depths.get(variant)
        if depth is not None and np.isfinite(depth) and low <= depth <= high:  # e.g. not a clip bound of 100
            color = "white" if colors is None else colors[variant]
            axis.axvline(depth, color=color, linestyle=":" if colors is None else "--", linewidth=1, alpha=0.8)


def plot_accuracy_heatmaps(grids: pd.DataFrame, path: Path, title: str, train_depths: dict | None = None) -> bool:
    """acc(n, K) in percent, mean over seeds: one panel per variant, lengths down, loops across."""
    if grids.empty:
        return False
    variants = sorted(grids["variant"].unique())
    fig, axes = _panels(len(variants), title)
    for axis, variant in zip(axes, variants):
        part = grids[grids["variant"] == variant]
        acc = part.groupby(["length", "loops"])["accuracy"].mean().unstack("loops").sort_index()
        image = axis.imshow(
            100 * acc.to_numpy(),
            vmin=0,
            vmax=100,
            cmap="viridis",
            aspect="auto",
            interpolation="nearest",
            extent=(acc.columns.min() - 0.5, acc.columns.max() + 0.5, len(acc) - 0.5, -0.5),
        )
        axis.set_yticks(range(len(acc)), [str(n) for n in acc.index])
        trained = int((part.drop_duplicates("length")["split"] == "id").sum())
        if 0 < trained < len(acc):
            axis.axhline(trained - 0.5, color="white", linestyle="--", linewidth=1)
        _mark_depths(axis, train_depths or {}, [variant])
        _integer_ticks(axis)
        axis.set(title=variant, xlabel="loops K", ylabel="length n")
    fig.colorbar(image, ax=axes, label="accuracy (%)")
    _save(fig, path)
    return True


def plot_oracle_by_length(per_length: pd.DataFrame, path: Path, title: str) -> bool:
    """Oracle(n) = max_K acc(n, K) against length per variant; dotted line at the train / OOD boundary."""
    if per_length.empty:
        return False
    fig, (axis,) = _panels(1, title, width=6.5, height=3.8)
    colors = _colors(per_length["variant"].unique())
    for variant, part in per_length.groupby("variant"):
        _seed_band(axis, part, "length", "oracle", variant, colors[variant])
    boundary = _split_boundary(per_length)
    if boundary is not None:
        axis.axvline(boundary, color="grey", linestyle=":", label="train | OOD")
    lengths = sorted(per_length["length"].unique())
    if len(lengths) <= MAX_LENGTH_TICKS:  # a tick at every evaluated length
        axis.set_xticks(lengths)
    axis.set(xlabel="length n", ylabel="Oracle(n) (%)", ylim=(-2, 102))
    _legend(axis)
    _save(fig, path)
    return True


def plot_flip_curves(grids: pd.DataFrame, path: Path, title: str, train_depths: dict | None = None) -> bool:
    """Flip rate Pr[ŷ_{K+1} ≠ ŷ_K] against K per variant, mean over OOD lengths (all lengths if none)."""
    if grids.empty:
        return False
    flips = grids[np.isfinite(grids["flip_rate"].astype(float))]  # the last K has no next answer: NaN
    if flips.empty:
        return False
    if (flips["split"] == "ood").any():
        flips = flips[flips["split"] == "ood"]
    per_run = flips.groupby(["variant", "run_id", "loops"], as_index=False)["flip_rate"].mean()
    fig, (axis,) = _panels(1, title, width=6.5, height=3.8)
    colors = _colors(per_run["variant"].unique())
    for variant, part in per_run.groupby("variant"):
        _seed_band(axis, part, "loops", "flip_rate", variant, colors[variant])
    _mark_depths(axis, train_depths or {}, colors, colors)
    axis.set_ylim(bottom=0)
    axis.set(xlabel="loops K", ylabel="flip rate K → K+1 (%)")
    _legend(axis)
    _save(fig, path)
    return True


def plot_depth_histograms(
    depths: pd.DataFrame, splits: pd.DataFrame, path: Path, title: str, train_depths: dict | None = None
) -> bool:
    """Test-time policy depth, fraction of samples per depth, ID and OOD lengths apart, one panel per variant
    (titled with its seeds), its training depth dashed.

    ``splits``: run_id, length, split — which lengths were in the training range.
    """
    if depths.empty:
        return False
    depths = depths.merge(splits, on=["run_id", "length"], how="left").fillna({"split": "all"})
    variants = sorted(depths["variant"].unique())
    fig, axes = _panels(len(variants), title, share=True)
    low, high = int(depths["depth"].min()), int(depths["depth"].max())
    for axis, variant in zip(axes, variants):
        counts = depths[depths["variant"] == variant].groupby(["split", "depth"])["count"].sum()
        names = list(counts.index.unique("split"))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            share = counts[name] / counts[name].sum()
            axis.bar(
                share.index + (i - (len(names) - 1) / 2) * width,
                100 * share.to_numpy(),
                width=width,
                color=SPLIT_COLORS.get(name, SPLIT_COLORS["all"]),
                label=name.upper() if name != "all" else name,
            )
        runs = depths.loc[depths["variant"] == variant, "run_id"].nunique()
        axis.set(xlabel="policy depth", ylabel="samples (%)", xlim=(low - 1, high + 1), ylim=(0, 105))
        axis.set_title(f"{variant} ({runs} seed{'s' * (runs != 1)})")
        _mark_depths(axis, train_depths or {}, [variant], {variant: "black"})
        _integer_ticks(axis)
        axis.legend(fontsize="small", loc="upper left", framealpha=0.8)
    _save(fig, path)
    return True


def plot_scaling_curves(grids: pd.DataFrame, path: Path, title: str, train_depths: dict | None = None) -> bool:
    """Test-time scaling: accuracy against loops, mean over lengths, per variant (log₂ x beyond 64 loops)."""
    curves = scaling_curves(grids)
    if curves.empty:
        return False
    fig, (axis,) = _panels(1, title, width=6.5, height=3.8)
    colors = _colors(curves["variant"].unique())
    for variant, part in curves.groupby("variant"):
        _seed_band(axis, part, "loops", "accuracy", variant, colors[variant])
    _mark_depths(axis, train_depths or {}, colors, colors)
    axis.set_xlim(0.5, curves["loops"].max() + 0.5)
    if curves["loops"].max() > 64:
        axis.set_xscale("log", base=2)
    axis.set(xlabel="loops", ylabel="accuracy, mean over lengths (%)", ylim=(-2, 102))
    _legend(axis)
    _save(fig, path)
    return True


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", str(text))


def write_task_plots(
    out: Path,
    task: str,
    per_length: pd.DataFrame,
    grids: pd.DataFrame,
    depths: pd.DataFrame,
    train_depths: dict | None = None,
) -> list[Path]:
    """Every figure of one task that its inputs allow; returns the PNGs written (each with a PDF beside it)."""
    per_length, grids, depths = (f[f["task.name"] == task] for f in (per_length, grids, depths))
    if not grids.empty:
        splits = grids[["run_id", "length", "split"]].drop_duplicates()
    else:
        splits = per_length[["run_id", "length", "split"]]
    figures = [
        ("accuracy", lambda p: plot_accuracy_heatmaps(grids, p, f"{task}: acc(n, K), mean over seeds", train_depths)),
        ("oracle", lambda p: plot_oracle_by_length(per_length, p, f"{task}: Oracle(n) over seeds")),
        ("flips", lambda p: plot_flip_curves(grids, p, f"{task}: flip rate against depth", train_depths)),
        ("depths", lambda p: plot_depth_histograms(depths, splits, p, f"{task}: test-time policy depth", train_depths)),
        ("scaling", lambda p: plot_scaling_curves(grids, p, f"{task}: test-time scaling", train_depths)),
    ]
    written = []
    for kind, plot in figures:
        path = out / f"{_slug(task)}-{kind}.png"
        if plot(path):
            written.append(path)
    return written
