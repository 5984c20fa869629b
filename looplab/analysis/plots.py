"""Plots of the mechanistic analysis (matplotlib, Agg backend): one function per figure.

Each is saved by :func:`looplab.plotting.save_figure` (a PNG and a PDF); symbols are
rendered with matplotlib's mathtext.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import Tensor

from looplab.plotting import pyplot, save_figure

__all__ = ["plot_convergence", "plot_cosine_matrix", "plot_attention_difference", "plot_colsum_depth"]

ATTENTION_PANELS = 6  # core layers shown by plot_attention_difference
MAX_SEPARATORS = 16  # loop boundaries drawn on the ColSum plot; more would hide the curves


def _integer_axis(axis, which: str = "both") -> None:
    """Layers and loops are integers: no 0.5-layer ticks."""
    from matplotlib.ticker import MaxNLocator

    for name in ("x", "y") if which == "both" else (which,):
        getattr(axis, f"{name}axis").set_major_locator(MaxNLocator(integer=True))


def _layer_ticks(axis, layers: int, which: str = "y") -> None:
    """A tick at every layer while they are few (an integer locator over one layer's ±0.5 gives tenths)."""
    if layers <= 16:
        getattr(axis, f"set_{which}ticks")(range(layers))


def _mark_training_depth(axis, depth: int | None, last: int, both: bool = False) -> None:
    """A white dashed line at the training depth on a loops axis (and the other axis too, ``both``)."""
    if depth is None or not 1 <= depth <= last:
        return
    axis.axvline(depth, color="white", linestyle="--", linewidth=1)
    if both:
        axis.axhline(depth, color="white", linestyle="--", linewidth=1)


def plot_convergence(delta: Tensor, path: Path, title: str = "", training_depth: int | None = None) -> None:
    """Heatmap of log10 Δ_{ℓ,t} for delta [layers, loops − 1] (loops 2..r on the x axis), the training depth
    dashed."""
    plt = pyplot()
    values = delta.double().clamp_min(1e-16).log10().numpy()
    fig, axis = plt.subplots(figsize=(7, 1.4 + 0.4 * values.shape[0]), layout="constrained")
    image = axis.imshow(
        values,
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        extent=(1.5, values.shape[1] + 1.5, values.shape[0] - 0.5, -0.5),
    )
    fig.colorbar(image, ax=axis, label=r"$\log_{10}\,\Delta_{\ell,t}$")
    _integer_axis(axis)
    _layer_ticks(axis, values.shape[0])
    _mark_training_depth(axis, training_depth, values.shape[1] + 1)
    axis.set_xlabel("loop $t$" + ("" if training_depth is None else f"; dashed: training depth {training_depth}"))
    axis.set_ylabel(r"core layer $\ell$")
    axis.set_title(title or r"convergence $\Delta_{\ell,t} = \|X_{\ell,t} - X_{\ell,t-1}\| \,/\, \|X_{\ell,t}\|$")
    save_figure(fig, path)


def plot_cosine_matrix(matrix: Tensor, path: Path, title: str = "") -> None:
    """1 − cos between the core layers' states at the last loop, matrix [layers, layers], on a log scale.

    Near a shared fixed point every cosine is 0.99…; 1 − cos on a log scale shows which layers
    agree to 1e-2 and which to 1e-8, where a linear cos scale shows one dark square. Cells print
    the same 1 − cos (a cos would read "1.0000" in every cell). One core layer has no pair: the
    figure says so.
    """
    from matplotlib.colors import LogNorm

    plt = pyplot()
    fig, axis = plt.subplots(figsize=(4.8, 4.2), layout="constrained")
    axis.set_title(title or "fixed points: cos between layers (last loop)", wrap=True)
    if matrix.shape[0] < 2:
        axis.set_axis_off()
        axis.text(0.5, 0.5, "one core layer: no pair of layers to compare", ha="center", va="center")
        save_figure(fig, path)
        return
    gap = (1 - matrix.double()).clamp_min(1e-16).numpy()
    diagonal = np.eye(len(gap), dtype=bool)
    off = gap[~diagonal]
    low, high = float(off.min()), float(off.max())
    shown = np.ma.masked_array(gap, mask=diagonal)  # a layer against itself says nothing
    cmap = plt.get_cmap("viridis_r").with_extremes(bad="#dddddd")
    image = axis.imshow(shown, norm=LogNorm(vmin=low / 3, vmax=max(high * 3, low * 10)), cmap=cmap)
    if matrix.shape[0] <= 12:
        for i in range(matrix.shape[0]):
            for j in range(matrix.shape[1]):
                if i != j:
                    axis.text(
                        j,
                        i,
                        f"{gap[i, j]:.0e}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="black",
                        bbox={"facecolor": "white", "alpha": 0.6, "linewidth": 0, "pad": 1},
                    )
    fig.colorbar(image, ax=axis, label=r"$1 - \cos$ (log scale, printed in the cells)")
    _integer_axis(axis)
    _layer_ticks(axis, matrix.shape[0], "x")
    _layer_ticks(axis, matrix.shape[0], "y")
    axis.set_xlabel(r"core layer $\ell'$")
    axis.set_ylabel(r"core layer $\ell$")
    save_figure(fig, path)


def plot_attention_difference(
    diff: Tensor, path: Path, title: str = "", max_layers: int = ATTENTION_PANELS, training_depth: int | None = None
) -> None:
    """‖A_{ℓ,t} − A_{ℓ,t′}‖_F heatmaps for diff [layers, loops, loops], one panel per layer.

    The colour scale spans the pairs of loops 2 and later: loop 1's attention differs from every
    other loop's by far the most, and on a scale that includes it the structure among the later
    loops (the band along the diagonal) would be one dark square. Loop 1's row and column show
    above the scale (the colour bar's arrow).
    """
    plt = pyplot()
    shown = min(diff.shape[0], max_layers)
    fig, axes = plt.subplots(1, shown, figsize=(3.4 * shown + 1, 3.6), squeeze=False, layout="constrained")
    later = diff[:shown, 1:, 1:]
    top = float(later.max() if later.numel() and float(later.max()) > 0 else diff.max()) or 1.0
    extent = (0.5, diff.shape[1] + 0.5, diff.shape[1] + 0.5, 0.5)
    for layer, axis in enumerate(axes[0]):
        image = axis.imshow(diff[layer].numpy(), vmin=0, vmax=top, cmap="magma", extent=extent)
        axis.set_title(rf"core layer $\ell = {layer}$")
        _mark_training_depth(axis, training_depth, diff.shape[1], both=True)
        axis.set_xlabel("loop $t'$")
        axis.set_ylabel("loop $t$")
        _integer_axis(axis)
    above = bool((diff[:shown] > top).any())
    fig.colorbar(
        image,
        ax=list(axes[0]),
        extend="max" if above else "neither",
        label=r"$\|A_{\ell,t} - A_{\ell,t'}\|_F$" + (" (loop 1 above)" if above else ""),
    )
    fig.suptitle(
        (title or "attention difference across loops")
        + ("" if training_depth is None else f" (dashed: training depth {training_depth})")
    )
    save_figure(fig, path)


def plot_colsum_depth(
    values: Tensor, labels: list[str], path: Path, title: str = "", xlabel: str | None = None
) -> None:
    """ColSum concentration [depth, H] over effective depth: each head a thin grey line, their mean in black,
    loop boundaries dotted (every k-th loop when there are many, so the curves stay visible). A
    feed-forward model (no ``.core0`` in ``labels``) has no boundaries; ``xlabel`` names its axis."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(8, 3.2), layout="constrained")
    depth = range(values.shape[0])
    for head in range(values.shape[1]):
        label = "each head" if head == 0 else None
        axis.plot(depth, values[:, head].numpy(), color="0.6", linewidth=0.7, alpha=0.7, label=label)
    axis.plot(depth, values.mean(1).numpy(), color="black", linewidth=1.4, label="mean over heads")
    starts = [i for i, name in enumerate(labels) if name.endswith(".core0")]
    every = max(1, -(-len(starts) // MAX_SEPARATORS))
    for start in starts[::every]:
        axis.axvline(start - 0.5, color="grey", linestyle=":", linewidth=0.6)
    top = float(values.max()) if values.numel() else 1.0
    axis.set_ylim(0, min(1.0, max(top * 1.15, 0.05)))
    if xlabel is None:
        xlabel = "effective depth (prelude, loop × core layer, coda)\n" + (
            f"a dotted line every {every} loops" if every > 1 else "dotted: loop starts"
        )
    axis.set_xlabel(xlabel)
    axis.set_ylabel("ColSum concentration")
    axis.set_title(title or "attention-sink stages over effective depth")
    axis.legend(loc="upper right")
    save_figure(fig, path)
