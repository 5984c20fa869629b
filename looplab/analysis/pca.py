"""PCA of latent trajectories: how each token's state moves across loops.

The states h_t[p] of one sample for every loop t and position p are projected
onto their top principal components (fitted on all of them together), so each
position traces a path through loops in 2-D or 3-D.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from looplab.plotting import pyplot, save_figure


def trajectory_pca(states: Tensor, components: int = 3) -> tuple[Tensor, Tensor]:
    """Project states [T, L, d] onto their top principal components.

    Returns:
        coordinates [T, L, components] and the explained-variance ratio [components].
    """
    flat = states.reshape(-1, states.shape[-1]).double()
    centred = flat - flat.mean(0)
    _, singular, basis = torch.linalg.svd(centred, full_matrices=False)
    variance = singular.pow(2)
    k = min(components, basis.shape[0])
    coords = (centred @ basis[:k].T).reshape(*states.shape[:2], k)
    return coords, variance[:k] / variance.sum().clamp_min(1e-30)


def plot_trajectories(coords: Tensor, explained: Tensor, path2d: Path, path3d: Path, title: str = "") -> None:
    """2-D and 3-D plots: one line per position, from loop 1 (circle) to the last loop (cross).

    Positions are coloured along one sequential map with a colour bar (a cycle of ten colours
    would repeat), and the legend says which marker is which loop.
    """
    plt = pyplot()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    coords = coords.numpy()
    positions = coords.shape[1]
    norm = Normalize(0, max(positions - 1, 1))
    cmap = plt.get_cmap("viridis")
    labels = [f"PC{i + 1} ({100 * float(v):.0f}%)" for i, v in enumerate(explained)]
    for dims, path in ((2, path2d), (3, path3d)):
        if coords.shape[-1] < dims:
            continue
        fig = plt.figure(figsize=(5.5, 4.5), layout="constrained")
        axis = fig.add_subplot(projection="3d" if dims == 3 else None)
        for position in range(positions):
            track = coords[:, position, :dims].T
            color = cmap(norm(position))
            axis.plot(*track, linewidth=1, color=color)
            axis.scatter(*track[:, :1], marker="o", color=color, s=12)
            axis.scatter(*track[:, -1:], marker="x", color=color, s=16)
        axis.set_xlabel(labels[0])
        axis.set_ylabel(labels[1])
        if dims == 3:
            axis.set_zlabel(labels[2])
            axis.set_box_aspect(None, zoom=0.8)  # room inside the figure for the labels of the projected box
            for along in (axis.xaxis, axis.yaxis, axis.zaxis):  # projected tick labels crowd: four at most
                along.set_major_locator(MaxNLocator(4))
        keys = [
            Line2D([], [], marker="o", color="grey", linestyle="none", label="loop 1"),
            Line2D([], [], marker="x", color="grey", linestyle="none", label=f"loop {coords.shape[0]}"),
        ]
        axis.legend(handles=keys, fontsize="small", loc="best")
        bar = fig.colorbar(ScalarMappable(norm, cmap), ax=axis, label="position", shrink=0.8)
        bar.locator = MaxNLocator(integer=True)
        bar.update_ticks()
        axis.set_title(title)
        save_figure(fig, path)
