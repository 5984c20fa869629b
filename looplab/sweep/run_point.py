"""Train, evaluate (and optionally analyse) one sweep point: the unit of work a worker runs.

A point is done when its ``result.json`` exists; it is written last and
atomically, so a point killed at any moment is re-run on the next sweep and
resumes from its latest checkpoint (training resume is exact on CPU, and the
evaluation draws its samples from the run's seed, so the re-run gives the same
numbers as an uninterrupted one). A relative ``train.init_from`` is read from the
sweep dir.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

RESULT_FILE = "result.json"
#: where a point's summaries land, under its run dir: the evaluation of an exact-match task, that of a
#: language-modelling task, and the mechanistic analysis
EVAL_SUMMARY = ("eval", "summary.json")
LM_SUMMARY = ("eval", "lm_summary.json")
ANALYSIS_SUMMARY = ("analysis", "mechanistic", "summary.json")


@dataclass
class PointJob:
    """Everything a worker needs, as plain data (it crosses process and Ray boundaries)."""

    run_dir: str
    config_toml: str
    scaling: bool = False
    evaluate: bool = True
    analysis: dict | None = None  # the mechanistic analysis's options; None: no analysis

    @property
    def analyze(self) -> bool:
        return self.analysis is not None


def read_result(run_dir: Path) -> dict | None:
    """The point's result record, or None while it is unfinished (no ``result.json``, or one that is
    not a readable record: such a point is simply run again)."""
    try:
        result = json.loads((run_dir / RESULT_FILE).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return result if isinstance(result, dict) and result.get("status") in ("done", "diverged") else None


def is_done(job: PointJob) -> bool:
    """Whether the point has finished: its result is recorded and, unless it diverged, the outputs
    the sweep asks for are there (a deleted ``eval/summary.json`` makes the point run again, which
    then only evaluates: training resumes at its last step)."""
    run_dir = Path(job.run_dir)
    result = read_result(run_dir)
    if result is None:
        return False
    if result["status"] == "diverged":
        return True
    evaluated = any(run_dir.joinpath(*parts).is_file() for parts in (EVAL_SUMMARY, LM_SUMMARY))
    analysed = run_dir.joinpath(*ANALYSIS_SUMMARY).is_file()
    return (evaluated or not job.evaluate) and (analysed or not job.analyze)


def run_point(job: PointJob) -> dict:
    """Run one point to completion in this process (one torch thread); returns its result record.

    Returns:
        ``{"status": "done" | "diverged", "wall_s": float}``, also written to ``result.json``.
        A diverged run (non-finite loss) is a result, not an error: it is recorded and not retried.
    """
    import torch

    from looplab.config import from_dict
    from looplab.train.stop import stop_on_signals

    torch.set_num_threads(1)
    run_dir = Path(job.run_dir)
    config = from_dict(tomllib.loads(job.config_toml))
    source = config.train.init_from
    if source and not Path(source).is_absolute():
        # a sweep's fine-tune names its pretrained run from the sweep dir (runs/<id>), wherever workers start
        config = replace(config, train=replace(config.train, init_from=str(run_dir.parent.parent / source)))
    began = time.perf_counter()
    # a stop signal during evaluation or analysis waits for them to finish (seconds), then the
    # sweep starts no new point; during training it checkpoints and stops (TrainingStopped)
    with stop_on_signals():
        return _run_point(job, run_dir, config, began)


def _run_point(job: PointJob, run_dir: Path, config, began: float) -> dict:
    from looplab.io import atomic_write
    from looplab.train.trainer import TrainingDiverged, train

    try:
        train(config, run_dir, progress=False)
        status = "done"
    except TrainingDiverged:
        status = "diverged"
    if status == "done" and job.evaluate:
        from looplab.text.evaluate import evaluate_any_run

        evaluate_any_run(run_dir, scaling=job.scaling)
    if status == "done" and job.analyze:
        from looplab.analysis.mechanistic import analyze_mechanistic

        analyze_mechanistic(run_dir, **job.analysis)
    result = {"status": status, "wall_s": round(time.perf_counter() - began, 3)}
    atomic_write(run_dir / RESULT_FILE, lambda p: p.write_text(json.dumps(result)))
    return result
