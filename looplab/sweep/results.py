"""Collect a sweep's finished runs into ``results.parquet``: one row per run.

Columns: ``run_id``, ``run_dir`` (relative to the sweep dir), ``variant``,
``status``, ``wall_s``; every resolved config key as ``section.key``; every
scalar of ``eval/summary.json`` by its dotted path (``oracle_ood``,
``per_length.20.oracle``, ``training_cost.block_evals``…); a text run's
``eval/lm_summary.json`` under ``lm.``; a mechanistic analysis under
``analysis.``. Lists are stored as JSON strings. Everything here is re-read
from the run dirs, so the table can always be rebuilt from disk.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd

from looplab.io import atomic_write, flatten, read_json_object
from looplab.rundir import RUNS_DIR
from looplab.sweep.run_point import ANALYSIS_SUMMARY, EVAL_SUMMARY, LM_SUMMARY, read_result
from looplab.sweep.spec import RunPoint

RESULTS_FILE = "results.parquet"
SUMMARIES = {"": EVAL_SUMMARY, "lm.": LM_SUMMARY, "analysis.": ANALYSIS_SUMMARY}


def run_row(sweep_dir: Path, point: RunPoint) -> dict[str, Any] | None:
    """The results row of one point, or None while it is unfinished."""
    run_dir = sweep_dir / RUNS_DIR / point.run_id
    result = read_result(run_dir)
    if result is None:
        return None
    row: dict[str, Any] = {
        "run_id": point.run_id,
        "run_dir": f"{RUNS_DIR}/{point.run_id}",
        "variant": point.variant,
        **result,
    }
    row.update(flatten(tomllib.loads(point.config_toml)))
    for prefix, parts in SUMMARIES.items():
        path = run_dir.joinpath(*parts)
        if path.is_file():
            row.update(flatten(read_json_object(path, "run summary"), prefix))
    return row


def write_results(sweep_dir: Path, points: list[RunPoint]) -> pd.DataFrame:
    """Rebuild ``results.parquet`` from the finished points (in sweep order) and return it."""
    rows = [row for row in (run_row(sweep_dir, point) for point in points) if row is not None]
    frame = pd.DataFrame(rows)
    for column in frame.columns:
        # A column holding strings and numbers at once cannot be stored in parquet: keep it as text.
        kinds = set(frame[column].dropna().map(type))
        if str in kinds and len(kinds) > 1:
            frame[column] = frame[column].map(lambda v: v if v is None or isinstance(v, str) else json.dumps(v))
    atomic_write(sweep_dir / RESULTS_FILE, lambda p: frame.to_parquet(p, index=False))
    return frame
