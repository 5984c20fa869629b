"""Loop scaling of a looped LM trained on text with reasoning problems (``kjv_arithmetic``).

Beside the validation loss of :func:`looplab.text.evaluate.lm_loss_by_loops`, per
loop count t = 1..T:

    reasoning_id, reasoning_ood   greedy-decoding exact match on chain-arithmetic problems
                                  of the training sizes (n <= task.train_max) and longer ones
    state_norm                    ‖h_t‖ per token on the problems (RMS over the rows)
    spectral_radius               ρ(∂Φ/∂h at h_t) by power iteration, mean over a few problems

and per (n, t) the accuracy of each problem size (``reasoning_loops.csv``). The
summary holds, for loss and both accuracies, the value at the training depth and
at twice it, the relative drop between them (the paper's 4 → 8) and the peak with
its loop count, and how far the state norm grew from loop 1 to loop T.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.eval.grid import LengthOutcome, grid_frame
from looplab.eval.scaling import finite_mean, relative_drop
from looplab.model import LoopedTransformer
from looplab.plotting import pyplot, save_figure
from looplab.seeding import derive_generator
from looplab.stability.spectral import warm_spectral_radii
from looplab.tasks.reasoning import ChainArithmetic

SPECTRAL_SAMPLES = 8
SPECTRAL_ITERS = 4
REASONING_FILE = "reasoning_loops.csv"
SCALING_PLOT = "lm_scaling.png"


def spectral_by_loops(
    model: LoopedTransformer, task: ChainArithmetic, length: int, max_loops: int, seed: int
) -> np.ndarray:
    """[max_loops] mean spectral radius over :data:`SPECTRAL_SAMPLES` problems of size ``length``,
    by warm-started power iteration (:func:`looplab.stability.spectral.warm_spectral_radii`)."""
    batch = task.sample(length, SPECTRAL_SAMPLES, derive_generator(seed, "lm-spectral"))
    batch = batch.to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        radii = warm_spectral_radii(
            model, batch.tokens, batch.valid, max_loops, SPECTRAL_ITERS, derive_generator(seed, "lm-power")
        )
    finally:
        model.train(was_training)
    return radii.mean(1).cpu().numpy()


def reasoning_columns(outcomes: list[LengthOutcome], train_max: int, spectral: np.ndarray) -> pd.DataFrame:
    """Per loop count: reasoning_id, reasoning_ood (NaN without longer sizes), state_norm, spectral_radius."""

    def pooled(keep) -> np.ndarray:
        chosen = [o.correct for o in outcomes if keep(o.length)]
        return np.concatenate(chosen).mean(axis=0) if chosen else np.full(len(spectral), np.nan)

    return pd.DataFrame(
        {
            "reasoning_id": pooled(lambda n: n <= train_max),
            "reasoning_ood": pooled(lambda n: n > train_max),
            "state_norm": finite_mean(np.concatenate([o.state_norm for o in outcomes])),
            "spectral_radius": spectral,
        }
    )


def reasoning_grid(outcomes: list[LengthOutcome], train_max: int) -> pd.DataFrame:
    """One row per (length, loops): accuracy and split (``reasoning_loops.csv``)."""
    return grid_frame(outcomes, train_max)[["length", "loops", "split", "accuracy"]]


def at_loops(frame: pd.DataFrame, column: str, loops: int | None) -> float | None:
    rows = frame.loc[frame.loops == loops, column]
    value = float(rows.iloc[0]) if loops is not None and len(rows) else None
    return None if value is None or math.isnan(value) else value


SCALED = {"loss": ("loss", True), "id": ("reasoning_id", False), "ood": ("reasoning_ood", False)}


def scaling_summary(frame: pd.DataFrame, depth: int | None) -> dict:
    """For the loss and each accuracy (fractions): the value at ``depth`` and at 2·``depth``, the
    relative drop between them (for the loss: the relative growth), the best value and its loops."""
    summary: dict = {}
    twice = None if depth is None else 2 * depth
    for key, (column, lower_is_better) in SCALED.items():
        values = frame[column].to_numpy(dtype=float) if column in frame else np.array([np.nan])
        if np.isnan(values).all():
            continue
        filled = np.where(np.isfinite(values), values, np.inf if lower_is_better else -np.inf)
        best = int(filled.argmin() if lower_is_better else filled.argmax())
        before, after = at_loops(frame, column, depth), at_loops(frame, column, twice)
        summary[key] = {
            "at_depth": before,
            "at_twice_depth": after,
            "relative_drop": relative_drop(before, after, lower_is_better),
            "best": float(values[best]),
            "best_loops": int(frame.loops.iloc[best]),
            "at_max_loops": float(values[-1]) if math.isfinite(values[-1]) else None,
        }
    summary["spectral_radius_at_depth"] = at_loops(frame, "spectral_radius", depth)
    summary["spectral_radius_at_max_loops"] = float(frame["spectral_radius"].iloc[-1])
    summary["state_norm_growth"] = float(frame["state_norm"].iloc[-1] / frame["state_norm"].iloc[0])
    return summary


def plot_loop_scaling(frame: pd.DataFrame, path: Path, depth: int | None, title: str = "") -> None:
    """Three panels against loops (log x): validation loss, exact match (ID and longer), ‖h_t‖ and ρ."""
    plt = pyplot()

    fig, (loss, accuracy, dynamics) = plt.subplots(1, 3, figsize=(13, 3.6))
    loss.plot(frame.loops, frame.loss.where(np.isfinite(frame.loss)), marker=".")
    loss.set(ylabel="KJV validation loss (nats)", title="language modelling")
    accuracy.plot(frame.loops, 100 * frame.reasoning_id, label="train sizes")
    if frame.reasoning_ood.notna().any():
        accuracy.plot(frame.loops, 100 * frame.reasoning_ood, label="longer chains")
    accuracy.set(ylabel="exact match (%)", ylim=(-2, 102), title="chain arithmetic")
    accuracy.legend()
    dynamics.plot(frame.loops, frame.state_norm, label="‖h_t‖ per token")
    dynamics.plot(frame.loops, frame.spectral_radius, label="ρ(∂Φ/∂h)")
    dynamics.axhline(1.0, color="grey", linewidth=0.8)
    dynamics.set(yscale="log", title="dynamics")
    dynamics.legend()
    for axis in (loss, accuracy, dynamics):
        axis.set(xscale="log", xlabel="loops")
        if depth is not None:
            axis.axvline(depth, color="grey", linestyle="--")
    fig.suptitle(title)
    save_figure(fig, path)
