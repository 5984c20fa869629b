"""Spectral radius of the loop Jacobian along a trajectory (docs/methods.md §6).

For each loop t = 1..T of one unroll, ρ(∂Φ/∂h at h_t) per sample: by power
iteration (any size, warm-started along the trajectory) and, for small states at
a few loops, exactly from the full Jacobian.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopedModel
from looplab.plotting import pyplot, save_figure
from looplab.progress import Progress
from looplab.stability.jacobian import (
    LoopMap,
    loop_map,
    power_iteration,
    random_direction,
    spectral_radius_exact,
)
from looplab.tasks import TaskBatch

EXACT_MAX_DIM = 4096


def default_exact_loops(loops: int) -> tuple[int, ...]:
    """Where ``analyze spectral`` computes the exact spectrum unless told: the first, middle and last loop."""
    return tuple(sorted({1, (loops + 1) // 2, loops}))


def spectral_trajectory(
    model: LoopedTransformer,
    batch: TaskBatch,
    loops: int,
    iters: int,
    exact_loops: Collection[int],
    generator: torch.Generator,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """One row per (loop, sample): ``rho_power``, ``rayleigh`` and ``rho_exact`` (NaN off ``exact_loops``).

    The power iteration is warm-started: each loop starts from the previous loop's last
    direction (the Jacobian changes little along a trajectory), with ``4 × iters`` iterations
    from a random start at loop 1 and ``iters`` after. The exact spectrum, from the full
    (L·d) × (L·d) Jacobian of each sample, is computed at ``exact_loops`` only.
    """
    rows = []
    with torch.no_grad():
        h0, e, ctx = model.start(batch.tokens, batch.valid)
    phi = loop_map(model, e, batch.valid, ctx)  # in start's context (a family's may hold what start read)
    trajectory = warm_power_iterations(phi, h0, batch.valid, loops, iters, generator)
    singles = {}  # sample → its loop map alone, over its valid tokens (in its own start's context)
    for t, (h, growth, rayleigh) in enumerate(trajectory, start=1):
        for i in range(len(h)):
            row = {"loop": t, "sample": i, "rho_power": float(growth[i]), "rayleigh": float(rayleigh[i])}
            row["rho_exact"] = float("nan")
            if t in exact_loops:
                length = int(batch.valid[i].sum())
                if i not in singles:
                    tokens, valid = batch.tokens[i : i + 1, :length], batch.valid[i : i + 1, :length]
                    with torch.no_grad():
                        _, _, single_ctx = model.start(tokens, valid)
                    singles[i] = loop_map(model, e[i : i + 1, :length], valid, single_ctx)
                row["rho_exact"] = spectral_radius_exact(singles[i], h[i : i + 1, :length])
            rows.append(row)
        if progress is not None:
            progress.advance(detail=f"loop {t}, mean ρ {float(growth.mean()):.3f}")
    return pd.DataFrame(rows)


def power_products(loops: int, iters: int) -> int:
    """The Jacobian–vector products :func:`warm_power_iterations` takes along ``loops`` loops: 4 × ``iters`` at
    loop 1, ``iters`` after, and one more a loop for the Rayleigh quotient (:func:`power_iteration`)."""
    return 4 * iters + 1 + (loops - 1) * (iters + 1)


def warm_power_iterations(
    phi: LoopMap, h: Tensor, valid: Tensor, loops: int, iters: int, generator: torch.Generator
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Yield (h_t [B, L, d], growth [B], rayleigh [B]) for t = 1..loops along h_t = Φ(h_{t−1}) from h_0 = ``h``.

    Each loop's power iteration starts from the previous loop's last direction: along a
    trajectory the Jacobian changes little, so a few iterations per loop do what many from
    a random start do (the random start at loop 1 gets ``4 × iters``). growth and rayleigh
    are :func:`looplab.stability.jacobian.spectral_radius_power`'s.
    """
    v = None
    for t in range(loops):
        with torch.no_grad():
            h = phi(h)
        if v is None:  # drawn at h_1's width, which may differ from h_0's (Inkling-2's state gains blocks)
            v = random_direction(valid, h.shape[-1], generator, dtype=h.dtype)
        growth, rayleigh, v = power_iteration(phi, h, valid, 4 * iters if t == 0 else iters, v)
        yield h, growth, rayleigh


@torch.no_grad()
def warm_radii(phi: LoopMap, h: Tensor, valid: Tensor, loops: int, iters: int, generator: torch.Generator) -> Tensor:
    """[loops, B] ρ(∂Φ/∂h at h_t) along h_t = Φ(h_{t−1}) from h_0 = ``h``, for any loop map Φ
    (:func:`warm_power_iterations`)."""
    return torch.stack([growth for _, growth, _ in warm_power_iterations(phi, h, valid, loops, iters, generator)])


@torch.no_grad()
def warm_spectral_radii(
    model: LoopedModel, tokens: Tensor, valid: Tensor, loops: int, iters: int, generator: torch.Generator
) -> Tensor:
    """[loops, B] :func:`warm_radii` of a looped model's core on ``tokens`` [B, L] with ``valid`` [B, L]:
    a looplab model or any other of the protocol (a retrofitted pretrained model, its ``valid`` the
    attention mask)."""
    h, e, ctx = model.start(tokens, valid)
    return warm_radii(loop_map(model, e, valid.bool(), ctx), h, valid.bool(), loops, iters, generator)


def plot_spectral(frame: pd.DataFrame, path: Path, title: str = "", training_depth: int | None = None) -> None:
    """Mean ρ per loop (power iteration, and exact when present) with the ρ = 1 line and the training depth."""
    plt = pyplot()

    per_loop = frame.groupby("loop").mean(numeric_only=True)
    fig, axis = plt.subplots(figsize=(6, 3.6))
    axis.plot(per_loop.index, per_loop["rho_power"], label="power iteration")
    exact = per_loop["rho_exact"].dropna() if "rho_exact" in per_loop else None
    if exact is not None and len(exact):
        axis.plot(exact.index, exact, linestyle="none", marker="o", label="exact eigenvalues")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    if training_depth is not None and training_depth <= per_loop.index.max():
        label = f"training depth {training_depth}"
        axis.axvline(training_depth, color="grey", linestyle="--", linewidth=0.8, label=label)
    axis.set(xlabel="loop $t$", ylabel=r"$\rho(\partial\Phi/\partial h)$ at $h_t$", title=title)
    axis.legend()
    save_figure(fig, path)
