"""Test-time scaling (docs/methods.md §6): accuracy, state norm and step size against loops 1..T.

Built from the same one-unroll outcomes as the evaluation grid. A sample whose
state is not finite at K counts as wrong there and is reported in
``nonfinite_fraction`` — divergence is a measurement, never a crash.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.eval.grid import LengthOutcome
from looplab.plotting import pyplot, save_figure

REPORTED_LOOPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def relative_drop(before: float | None, after: float | None, lower_is_better: bool = False) -> float | None:
    """(before − after) / before for an accuracy; for a loss, how much it grew: (after − before) / before.
    None (undefined, not "no drop") when either is missing or ``before`` is 0."""
    if before is None or after is None or before == 0:
        return None
    change = (after - before) if lower_is_better else (before - after)
    return change / abs(before)


def finite_mean(values: np.ndarray) -> np.ndarray:
    """Column means over the finite entries of [N, T] (NaN where none is finite)."""
    finite = np.isfinite(values)
    counts = finite.sum(axis=0)
    totals = np.where(finite, values, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, totals / np.maximum(counts, 1), np.nan)


def scaling_frame(outcomes: list[LengthOutcome]) -> pd.DataFrame:
    """One row per loop count K, pooled over every evaluated sample and length.

    Columns: loops, accuracy, state_norm, step_norm (means over finite states), nonfinite_fraction.
    """
    correct = np.concatenate([o.correct for o in outcomes])
    state = np.concatenate([o.state_norm for o in outcomes])
    step = np.concatenate([o.step_norm for o in outcomes])
    return pd.DataFrame(
        {
            "loops": np.arange(1, correct.shape[1] + 1),
            "accuracy": correct.mean(axis=0),
            "state_norm": finite_mean(state),
            "step_norm": finite_mean(step),
            "nonfinite_fraction": (~np.isfinite(state)).mean(axis=0),
        }
    )


def scaling_summary(frame: pd.DataFrame) -> dict:
    """Peak accuracy and where it is reached, accuracy at powers of two, relative drop peak → last."""
    accuracy = frame["accuracy"].to_numpy()
    peak_index = int(accuracy.argmax())
    peak = float(accuracy[peak_index])
    return {
        "scaling_peak": peak,
        "scaling_peak_loops": int(frame["loops"].iloc[peak_index]),
        "scaling_at": {str(k): float(accuracy[k - 1]) for k in REPORTED_LOOPS if k <= len(accuracy)},
        # a peak of 0 has nothing to drop from: undefined, not "no drop"
        "relative_drop": relative_drop(peak, float(accuracy[-1])),
        "nonfinite_last": float(frame["nonfinite_fraction"].iloc[-1]),
    }


def _two_and_five(value: float, _position) -> str:
    """A minor log tick's label in plain numbers, at 2 and 5 times a power of ten only (9 labels a decade
    would touch)."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if any(abs(mantissa - m) < 1e-6 for m in (2, 5)) else ""


def plot_scaling(frame: pd.DataFrame, path: Path, title: str = "", depth: int | None = None) -> None:
    """Accuracy (left) and state / step norms on a log scale (right) against loops; ``depth``, the run's
    training depth where it has one, marked on both."""
    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    left.plot(frame["loops"], 100 * frame["accuracy"], color="tab:blue")
    left.set(xlabel="loops", ylabel="exact-match accuracy (%)", ylim=(-2, 102), title="accuracy")
    right.plot(frame["loops"], frame["state_norm"], label=r"$\|h_t\|$ per token")
    right.plot(frame["loops"], frame["step_norm"], label=r"$\|h_t - h_{t-1}\|$ per token")
    right.set(xlabel="loops", yscale="log", title="state and step norms")
    from matplotlib.ticker import FormatStrFormatter, FuncFormatter

    right.yaxis.set_major_formatter(FormatStrFormatter("%g"))  # 1, not 10⁰
    right.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
    if depth is not None:
        for axis in (left, right):
            axis.axvline(depth, color="grey", linestyle="--", linewidth=0.8, label=f"training depth {depth}")
    if frame["nonfinite_fraction"].max() > 0:
        first = int(frame["loops"][frame["nonfinite_fraction"] > 0].iloc[0])
        for axis in (left, right):
            axis.axvline(first, color="tab:red", linestyle=":", label="first non-finite state")
    right.legend()
    fig.suptitle(title)
    save_figure(fig, path)
