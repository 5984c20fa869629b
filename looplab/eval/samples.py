"""Per-sample evaluation outcomes on disk (``eval/samples.parquet``), enough to recompute summary.json.

One row per evaluated instance:

    length         n
    sample         its index i in 0..samples−1 (instance i of ``eval_batches``)
    policy_depth   the schedule's test-time depth, clipped to [1, T]
    correct        list of T bools: whole-answer exact match after K = 1..T loops
    flips          list of T − 1 bools: the answer after K + 1 loops differs from after K
    depth_<exit>   the depth each registered exit chose (e.g. depth_fixed, depth_confidence)
    hazard_logits  list of T float32 halting logits (learned halting schedules only)

:func:`outcomes_from_samples` reads the rows back into :class:`LengthOutcome`s,
and ``summarize`` of them gives the metrics of summary.json again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from looplab.eval.grid import LengthOutcome
from looplab.exits import exit_depths

SAMPLES_FILE = "samples.parquet"
_DEPTH = "depth_"


def samples_frame(outcomes: list[LengthOutcome], exits: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per sample of every outcome (columns in the module docstring); ``exits``: each exit's
    parameters (default: their defaults)."""
    parts = []
    for outcome in outcomes:
        count = len(outcome.correct)
        part = {
            "length": np.full(count, outcome.length),
            "sample": np.arange(count),
            "policy_depth": outcome.policy_depth.astype(np.int64),
            "correct": list(outcome.correct),
            "flips": list(outcome.flips),
        }
        chosen = outcome.exit_depths if outcome.exit_depths is not None else exit_depths(outcome, exits)
        part.update({_DEPTH + name: np.asarray(depths, dtype=np.int64) for name, depths in chosen.items()})
        if outcome.hazard_logits is not None:
            part["hazard_logits"] = list(outcome.hazard_logits.astype(np.float32))
        parts.append(pd.DataFrame(part))
    return pd.concat(parts, ignore_index=True)


def outcomes_from_samples(frame: pd.DataFrame) -> list[LengthOutcome]:
    """The outcomes a :func:`samples_frame` holds, one per length in order of appearance."""
    outcomes = []
    exits = [column for column in frame.columns if column.startswith(_DEPTH)]
    for length, rows in frame.groupby("length", sort=False):
        rows = rows.sort_values("sample")
        hazards = rows["hazard_logits"] if "hazard_logits" in rows else None
        outcomes.append(
            LengthOutcome(
                length=int(length),
                correct=np.stack(rows["correct"].to_numpy()).astype(bool),
                flips=_stack_bool(rows["flips"]),
                policy_depth=rows["policy_depth"].to_numpy(),
                hazard_logits=None
                if hazards is None or hazards.isna().any()
                else np.stack(hazards.to_numpy()).astype(np.float32),
                exit_depths={
                    column[len(_DEPTH) :]: rows[column].to_numpy() for column in exits if not rows[column].isna().any()
                },
            )
        )
    return outcomes


def read_samples(eval_dir: str | Path) -> list[LengthOutcome]:
    """The outcomes of ``eval_dir/samples.parquet``."""
    return outcomes_from_samples(pd.read_parquet(Path(eval_dir) / SAMPLES_FILE))


def _stack_bool(column: pd.Series) -> np.ndarray:
    """[N, K] bool from a column of equal-length lists (K may be 0)."""
    values = [np.asarray(v, dtype=bool) for v in column]
    return np.stack(values) if values and values[0].size else np.zeros((len(values), 0), dtype=bool)
