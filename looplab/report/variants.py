"""What a result row's schedule says of itself: its label ("fixed K = 11") and the largest depth it trains at.

Both come from the registered schedule the row's ``schedule.*`` columns resolve to, never from
the variant's name, so a plugin schedule is labelled and marked in the figures like a built-in one.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from looplab.config import ScheduleConfig
from looplab.errors import LooplabError
from looplab.schedules import resolve_schedule
from looplab.tasks import make_task


def _row_schedule(row: pd.Series) -> tuple[type, object]:
    """The registered schedule of a result row and its parameters, from the row's ``schedule.*`` columns."""
    keys = {
        column.removeprefix("schedule."): _plain(value)
        for column, value in row.items()
        if column.startswith("schedule.") and not _missing(value)
    }
    return resolve_schedule(ScheduleConfig(**keys))


def schedule_label(rows: pd.DataFrame) -> str:
    """What the variant of these result rows is, e.g. "fixed K = 11" (the schedule's own ``label``)."""
    if rows.empty or "schedule.name" not in rows:
        return "–"
    first = rows.iloc[0]
    try:
        schedule, params = _row_schedule(first)
    except LooplabError:  # a schedule not registered here, or results that lack or contradict its keys
        return str(first.get("schedule.name", "–"))
    return schedule.describe(params)


def training_depth(row: pd.Series) -> float:
    """The largest depth the row's schedule supervises (its T_train, as the schedule defines it); NaN when
    the row lacks a key it needs or names a schedule not registered here."""
    try:
        schedule, params = _row_schedule(row)
        return float(schedule.training_depth(params, _natural(row)))
    except (KeyError, TypeError, ValueError, LooplabError):
        return math.nan


def _plain(value):
    """A pandas cell as the Python scalar a config holds (numpy ints and floats, whole floats of int columns)."""
    value = value.item() if hasattr(value, "item") else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _natural(row: pd.Series) -> int:
    """T(train_max) of the row's task."""
    task = make_task(row["task.name"], int(row["task.alphabet"]))
    return int(task.steps(torch.tensor([int(row["task.train_max"])]))[0])
