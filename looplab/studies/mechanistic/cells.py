"""Cells and verdicts the mechanistic study's page blocks share: a seed mean with its interval, a
three-decimal number, the few-seeds mark, and an interval's verdict against a threshold."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from looplab.report.aggregate import FEW_SEEDS, seed_cell


def mean_cell(values, digits: int = 3, bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """:func:`~looplab.report.aggregate.seed_cell` of values in their own units (no percent scaling)."""
    return seed_cell(pd.Series(values, dtype=float), 1.0, digits, bounds)


def interval_verdict(low: float, high: float, threshold: float, holds_above: bool) -> str:
    """ "holds" when the interval lies on the claimed side of ``threshold``, "fails" on the other, "not resolved"
    when it straddles it, "n/a" when it is undefined."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "n/a"
    above, below = low > threshold, high < threshold
    if holds_above:
        return "holds" if above else "fails" if below else "not resolved"
    return "holds" if below else "fails" if above else "not resolved"


def few_seeds(n: int) -> str:
    """The mark a decision on fewer than FEW_SEEDS seeds carries (empty otherwise)."""
    return f" (few seeds: {n})" if n < FEW_SEEDS else ""


def three_decimals(value: float) -> str:
    """``value`` to three decimals; "n/a" when undefined."""
    return "n/a" if not np.isfinite(value) else f"{value:.3f}"
