"""Plots of the mechanistic analysis (matplotlib, Agg backend): one function per figure."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from looplab.plotting import pyplot

__all__ = ["plot_convergence", "plot_cosine_matrix", "plot_attention_difference", "plot_colsum_depth"]


def plot_convergence(delta: Tensor, path: Path, title: str = "") -> None:
    """Heatmap of log10 Δ_{ℓ,t} for delta [layers, loops − 1] (loops 2..r on the x axis)."""
    plt = pyplot()
    values = delta.double().clamp_min(1e-16).log10().numpy()
    fig, axis = plt.subplots(figsize=(7, 1.2 + 0.4 * values.shape[0]))
    image = axis.imshow(
        values,
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        extent=(1.5, values.shape[1] + 1.5, values.shape[0] - 0.5, -0.5),
    )
    fig.colorbar(image, ax=axis, label="log10 Δ")
    axis.set_xlabel("loop t")
    axis.set_ylabel("core layer")
    axis.set_title(title or "convergence ‖X_t − X_{t−1}‖ / ‖X_t‖")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cosine_matrix(matrix: Tensor, path: Path, title: str = "") -> None:
    """Cosine similarity of the core layers' states at the last loop, matrix [layers, layers]."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(4.5, 4))
    image = axis.imshow(matrix.numpy(), vmin=-1, vmax=1, cmap="RdBu_r")
    if matrix.shape[0] <= 12:
        for i in range(matrix.shape[0]):
            for j in range(matrix.shape[1]):
                axis.text(j, i, f"{float(matrix[i, j]):.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=axis, label="cos")
    axis.set_xlabel("core layer")
    axis.set_ylabel("core layer")
    axis.set_title(title or "fixed points: cos between layers (last loop)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


ATTENTION_PANELS = 6  # core layers shown by plot_attention_difference


def plot_attention_difference(diff: Tensor, path: Path, title: str = "", max_layers: int = ATTENTION_PANELS) -> None:
    """‖A_{ℓ,t} − A_{ℓ,t′}‖_F heatmaps for diff [layers, loops, loops], one panel per layer."""
    plt = pyplot()
    shown = min(diff.shape[0], max_layers)
    fig, axes = plt.subplots(1, shown, figsize=(3.4 * shown + 1, 3.4), squeeze=False, layout="constrained")
    top = float(diff.max()) or 1.0
    extent = (0.5, diff.shape[1] + 0.5, diff.shape[1] + 0.5, 0.5)
    for layer, axis in enumerate(axes[0]):
        image = axis.imshow(diff[layer].numpy(), vmin=0, vmax=top, cmap="magma", extent=extent)
        axis.set_title(f"core layer {layer}")
        axis.set_xlabel("loop t′")
        axis.set_ylabel("loop t")
    fig.colorbar(image, ax=list(axes[0]), label="‖A_t − A_t′‖_F")
    fig.suptitle(title or "attention difference across loops")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_colsum_depth(values: Tensor, labels: list[str], path: Path, title: str = "") -> None:
    """ColSum concentration [depth, H] over effective depth; a line per head, loop boundaries dashed."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(8, 3.2))
    depth = range(values.shape[0])
    for head in range(values.shape[1]):
        axis.plot(depth, values[:, head].numpy(), linewidth=0.8, label=f"head {head}")
    axis.plot(depth, values.mean(1).numpy(), color="black", linewidth=1.4, label="mean")
    starts = [i for i, name in enumerate(labels) if name.endswith(".core0")]
    if len(starts) <= 40:
        for start in starts:
            axis.axvline(start - 0.5, color="grey", linestyle="--", linewidth=0.5)
    axis.set_ylim(-0.02, 1.02)
    axis.set_xlabel("effective depth (prelude, loop × core, coda)")
    axis.set_ylabel("ColSum concentration")
    axis.set_title(title or "attention-sink stages over effective depth")
    axis.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
