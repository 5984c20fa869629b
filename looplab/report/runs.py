"""The report's inputs: a sweep's ``results.parquet``, its runs' evaluation files, per-run derived metrics.

``results.parquet`` has one row per finished run: ``run_id``, ``run_dir``
(relative to the sweep directory), ``variant`` (the grid point without its
seed), the resolved config flattened with dots (``task.name``, ...) and the
run's eval/summary.json scalars flattened the same way (``oracle_ood``,
``per_length.<n>.oracle``, ``scaling_at.<K>``, ``analysis.*``, ...).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow

from looplab.errors import LooplabError
from looplab.eval.scaling import relative_drop
from looplab.report.aggregate import numeric
from looplab.rundir import read_log
from looplab.sweep.run_point import read_result

RESULTS_FILE = "results.parquet"
REQUIRED_COLUMNS = ("run_id", "run_dir", "variant", "task.name", "run.seed")
KEYS = ("run_id", "task.name", "variant")  # what every per-run frame below carries
EVAL_DIR = "eval"

_PER_LENGTH = re.compile(r"per_length\.(\d+)\.oracle$")


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError, pyarrow.ArrowException) as error:
        raise LooplabError(f"cannot read {path}: {str(error).splitlines()[0]}") from None


def read_results(sweep_dir: Path) -> pd.DataFrame:
    """The sweep's results table, checked for the columns every report needs."""
    path = sweep_dir / RESULTS_FILE
    if not path.is_file():
        raise LooplabError(f"no {RESULTS_FILE} in {sweep_dir}; run `looplab sweep` first")
    results = _read_parquet(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        raise LooplabError(f"{path} lacks column(s) {', '.join(missing)}; was it written by `looplab sweep`?")
    if results.empty:
        raise LooplabError(f"{path} holds no finished runs; run `looplab sweep` first")
    return results.reset_index(drop=True)


def load_run_tables(results: pd.DataFrame, sweep_dir: Path, name: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """Every run's ``eval/<name>`` parquet stacked, with the run's KEYS prepended; each file must hold
    ``columns`` (a file that lacks one is named).

    Runs without the file (a text run, an older evaluation) are skipped; the
    result is an empty frame with only KEYS when no run has it.
    """
    parts = []
    for *key, run_dir in results[[*KEYS, "run_dir"]].itertuples(index=False, name=None):
        path = sweep_dir / run_dir / EVAL_DIR / name
        if path.is_file():
            table = _read_parquet(path)
            missing = [column for column in columns if column not in table.columns]
            if missing:
                raise LooplabError(f"{path} lacks column(s) {', '.join(missing)}; evaluate the run again")
            parts.append(table.assign(**dict(zip(KEYS, key))))
    if not parts:
        return pd.DataFrame(columns=list(KEYS))
    stacked = pd.concat(parts, ignore_index=True)
    return stacked[[*KEYS, *[c for c in stacked.columns if c not in KEYS]]]


def per_length_frame(results: pd.DataFrame) -> pd.DataFrame:
    """Oracle(n) per run from the ``per_length.<n>.oracle`` / ``.split`` columns.

    Columns: KEYS, length, oracle (fraction), split ("id" / "ood", None if not recorded).
    """
    parts = []
    for column in results.columns:
        match = _PER_LENGTH.match(column)
        if match:
            n = int(match.group(1))
            split = f"per_length.{n}.split"
            parts.append(
                results[list(KEYS)].assign(
                    length=n,
                    oracle=numeric(results, column),
                    split=results[split] if split in results.columns else None,
                )
            )
    if not parts:
        return pd.DataFrame(columns=[*KEYS, "length", "oracle", "split"])
    frame = pd.concat(parts, ignore_index=True)
    return frame[np.isfinite(frame["oracle"])].sort_values([*KEYS, "length"], ignore_index=True)


def scaling_curves(grids: pd.DataFrame) -> pd.DataFrame:
    """Accuracy against loops per run, mean over the evaluated lengths: KEYS, loops, accuracy."""
    if grids.empty:
        return pd.DataFrame(columns=[*KEYS, "loops", "accuracy"])
    return grids.groupby([*KEYS, "loops"], as_index=False, sort=True)["accuracy"].mean()


def relative_drops(start: pd.Series, end: pd.Series) -> pd.Series:
    """:func:`looplab.eval.scaling.relative_drop` row by row; NaN where it is undefined."""
    return start.combine(end, relative_drop).astype(float)


def add_scaling_metrics(results: pd.DataFrame, grids: pd.DataFrame) -> pd.DataFrame:
    """``results`` plus the per-run numbers the STARS comparison reads (NaN where not measurable).

    relative_drop_4_to_8   relative drop of accuracy from 4 to 8 loops (``scaling_at.4``, ``scaling_at.8``)
    accuracy_min_4_to_100  lowest accuracy over loops 4..100, mean over lengths (needs a grid to ≥ 100 loops)
    """
    results = results.copy()
    if {"scaling_at.4", "scaling_at.8"} <= set(results.columns):
        results["relative_drop_4_to_8"] = relative_drops(
            numeric(results, "scaling_at.4"), numeric(results, "scaling_at.8")
        )
    curves = scaling_curves(grids)
    if not curves.empty:
        window = curves[curves["loops"].between(4, 100)].groupby("run_id")
        covered = window["loops"].max() >= 100
        lowest = window["accuracy"].min().where(covered)
        results["accuracy_min_4_to_100"] = results["run_id"].map(lowest)
    return results


def run_status(run_dir: Path) -> str:
    """A sweep point's recorded status ("done" or "diverged"), "unknown" while it has no readable result."""
    result = read_result(run_dir)
    return result["status"] if result is not None else "unknown"


def seconds_per_step(run_dir: Path) -> float:
    """Wall seconds per training step over the run, from its log's last timed record (NaN without one)."""
    steps = [record for record in read_log(run_dir) if "elapsed_s" in record]
    return steps[-1]["elapsed_s"] / steps[-1]["step"] if steps else float("nan")
