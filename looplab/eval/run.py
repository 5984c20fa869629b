"""Evaluate a trained run directory: ``eval/grid.parquet``, ``policy_depths.parquet``, ``samples.parquet``
and ``summary.json`` (plus ``scaling.csv`` / ``scaling.png`` with ``--scaling``, and ``halting.csv`` for a
schedule with a halting head: halting applied per row against every row run to T_max)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.errors import LooplabError
from looplab.eval.grid import draw_eval_batches, evaluate_lengths, grid_frame, policy_depth_frame
from looplab.eval.halting_inference import halting_cap, halting_frame, halting_summary
from looplab.eval.metrics import headline_metrics, summarize
from looplab.eval.samples import SAMPLES_FILE, samples_frame
from looplab.eval.scaling import plot_scaling, scaling_frame, scaling_summary
from looplab.exits import exit_params
from looplab.experiment import Experiment, check_sizes, training_depth
from looplab.io import atomic_write, flatten, staged
from looplab.memory import check_fits, eval_bytes
from looplab.rundir import read_log

EVAL_DIR = "eval"


class Evaluation(dict):
    """What :func:`evaluate_run` returns: the summary (the dict ``summary.json`` holds), and in ``folder`` the
    folder the evaluation was written to."""

    def __init__(self, summary: dict, folder: Path):
        super().__init__(summary)
        self.folder = folder


def eval_dir(run_dir: Path, config, lengths: list[int] | None, max_loops: int | None, samples: int | None) -> Path:
    """Where an evaluation is written: ``RUN_DIR/eval`` with the run's own [eval] settings, else a folder
    beside it named by what differs (``eval/loops64``, ``eval/lengths8-16_samples128``), so a
    re-evaluation never replaces the one a sweep's report reads."""
    parts = []
    if lengths is not None and sorted(set(lengths)) != sorted(set(config.task.eval_lengths)):
        parts.append("lengths" + "-".join(map(str, sorted(set(lengths)))))
    if max_loops is not None and max_loops != config.eval.max_loops:
        parts.append(f"loops{max_loops}")
    if samples is not None and samples != config.eval.samples:
        parts.append(f"samples{samples}")
    return Path(run_dir) / EVAL_DIR / "_".join(parts) if parts else Path(run_dir) / EVAL_DIR


def evaluate_run(
    run_dir: str | Path,
    lengths: list[int] | None = None,
    max_loops: int | None = None,
    samples: int | None = None,
    scaling: bool = False,
    progress: bool = False,
) -> Evaluation:
    """Evaluate the latest checkpoint of ``run_dir``; options override the run's [eval] config.

    Written to :func:`eval_dir` (``RUN_DIR/eval`` unless an option differs from the run's config),
    which the returned :class:`Evaluation` names beside the summary. With ``scaling``, also write
    the test-time scaling curve (``scaling.csv`` and ``scaling.png``) and add its summary keys.
    """
    run_dir = Path(run_dir)
    exp = Experiment.from_run(run_dir)
    config = exp.config
    if not exp.task.exact_match:
        raise LooplabError(
            f"run {run_dir} trains the {config.task.name!r} language-modelling task; "
            f"evaluate it with: looplab eval {run_dir} (its loss against loops)"
        )
    for name, value in (("max-loops", max_loops), ("samples", samples)):
        if value is not None and value < 1:
            raise LooplabError(f"--{name} must be >= 1, got {value}")
    if lengths is not None and (not lengths or min(lengths) < 1):
        raise LooplabError("--lengths must be a non-empty list of integers >= 1")
    if lengths is not None:  # the sizes the task draws, before any estimate made from them
        check_sizes(exp.task, "--lengths", lengths)
    out = eval_dir(run_dir, config, lengths, max_loops, samples)
    lengths = sorted(set(lengths or config.task.eval_lengths))
    max_loops = max_loops or config.eval.max_loops
    samples = samples or config.eval.samples
    exits = exit_params(config.eval.exits)
    if exits["fixed"].depth > max_loops:
        raise LooplabError(
            f"eval.exits.fixed.depth {exits['fixed'].depth} cannot be read from --max-loops {max_loops}; "
            f"evaluate to at least {exits['fixed'].depth} loops"
        )
    check_fits(
        f"evaluating {samples} samples x {max_loops} loops x {len(lengths)} lengths",
        eval_bytes(config, exp.task, lengths, max_loops, samples),
        config.run.device,
        "use fewer --samples, --max-loops or --lengths",
    )
    if progress:
        print(
            f"eval: {run_dir} at {exp.checkpoint}: lengths {', '.join(map(str, lengths))}, loops 1..{max_loops}, "
            f"{samples} samples per length",
            flush=True,
        )
    # the halting comparison reads the same instances again: draw them once
    has_head = exp.schedule.module is not None and halting_cap(exp.schedule, max_loops) is not None
    drawn = draw_eval_batches(exp.task, lengths, samples, config.eval.batch_size, config.run.seed) if has_head else None
    outcomes = evaluate_lengths(
        exp.model,
        exp.task,
        exp.schedule,
        lengths,
        max_loops,
        samples,
        config.eval.batch_size,
        config.run.seed,
        progress,
        drawn,
    )
    summary = summarize(outcomes, config.task.train_max, exits, config.eval.flip_from)
    summary["training_cost"] = training_cost(run_dir)
    summary.update(
        {
            "checkpoint": exp.checkpoint,
            "max_loops": max_loops,
            "samples": samples,
            "train_range": [config.task.train_min, config.task.train_max],
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    with staged(out) as stage:  # all of this evaluation's files, or (a full disk, a crash) none
        if drawn is not None:
            halting = halting_frame(exp.model, exp.schedule, drawn, max_loops)
            summary["halting_inference"] = halting_summary(halting, config.task.train_max)
            atomic_write(stage / "halting.csv", lambda p: halting.to_csv(p, index=False))
        if scaling:
            curve = scaling_frame(outcomes)
            summary.update(scaling_summary(curve))
            atomic_write(stage / "scaling.csv", lambda p: curve.to_csv(p, index=False))
            depth = training_depth(config)  # T_train, the schedule's deepest supervised depth
            what = f"test-time scaling, {samples} samples at each of lengths {', '.join(map(str, lengths))}"
            plot_scaling(curve, stage / "scaling.png", what, depth)  # PNG + PDF
        frame = grid_frame(outcomes, config.task.train_max)
        atomic_write(stage / "grid.parquet", lambda p: frame.to_parquet(p, index=False))
        depths = policy_depth_frame(outcomes)
        atomic_write(stage / "policy_depths.parquet", lambda p: depths.to_parquet(p, index=False))
        per_sample = samples_frame(outcomes, exits)
        atomic_write(stage / SAMPLES_FILE, lambda p: per_sample.to_parquet(p, index=False))
        atomic_write(stage / "summary.json", lambda p: p.write_text(json.dumps(summary, indent=2)))
    if out == run_dir / EVAL_DIR:
        log_to_tensorboard(run_dir, config, summary, frame, curve if scaling else None)
    return Evaluation(summary, out)


def log_to_tensorboard(
    run_dir: Path, config, summary: dict, grid: pd.DataFrame | None = None, scaling: pd.DataFrame | None = None
) -> None:
    """The evaluation in TensorBoard: its headline metrics as ``eval/*`` scalars at the evaluated checkpoint's
    step, with the run's hyper-parameters (the HParams tab); its curves as scalars whose step is the curve's
    own x (``eval_by_loops/accuracy_<split>`` at step K, ``eval_by_length/{oracle,policy}`` at step n, the
    scaling curve's columns as ``scaling/*`` at step K); and every figure of ``eval/`` as an image
    (``figures/<name>``)."""
    from torch.utils.tensorboard import SummaryWriter

    step = int(summary["checkpoint"].split("_")[1]) if summary.get("checkpoint") else 0
    metrics = {f"eval/{k}": v for k, v in headline_metrics(summary).items()}
    hparams = flatten(config.to_dict())  # lists as JSON strings: every value a scalar
    with SummaryWriter(str(run_dir / "tensorboard")) as writer:
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)
        writer.add_hparams(hparams, {f"hparam/{k}": v for k, v in metrics.items()}, run_name="hparams")
        for name, x, value in curve_points(summary, grid, scaling):
            if value is not None and math.isfinite(value):  # undefined points are left out, not drawn as 0
                writer.add_scalar(name, value, x)
        for figure in sorted((run_dir / EVAL_DIR).glob("*.png")):
            writer.add_image(f"figures/{figure.stem}", read_png(figure), step, dataformats="HWC")


def curve_points(summary: dict, grid: pd.DataFrame | None, scaling: pd.DataFrame | None):
    """(tag, x, value) of every point of the evaluation's curves (see :func:`log_to_tensorboard`); a value may
    be None or NaN where the point is undefined."""
    if grid is not None:
        for (split, loops), accuracy in grid.groupby(["split", "loops"])["accuracy"].mean().items():
            yield f"eval_by_loops/accuracy_{split}", int(loops), float(accuracy)
    for length, row in sorted(summary.get("per_length", {}).items(), key=lambda item: int(item[0])):
        for key in ("oracle", "policy"):
            yield f"eval_by_length/{key}", int(length), row[key]
    if scaling is not None:
        for column in scaling.columns.drop("loops"):
            for loops, value in zip(scaling["loops"], scaling[column]):
                yield f"scaling/{column}", int(loops), float(value)


def read_png(path: Path) -> np.ndarray:
    """[H, W, 3] uint8 pixels of a PNG figure (its alpha dropped)."""
    from matplotlib.image import imread

    pixels = imread(path)[..., :3]
    return (pixels * 255).round().astype(np.uint8) if pixels.dtype != np.uint8 else pixels


def training_cost(run_dir: Path) -> dict:
    """Mean block evaluations per training step (and mean loops per row) from the JSONL log."""
    records = read_log(run_dir)
    cost = {}
    for key in ("block_evals", "row_loops_mean"):
        values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]
        cost[key] = float(sum(values) / len(values)) if values else None
    return cost


def _pct(value: float | None) -> str:
    """Percent, or "n/a" for an undefined (None) metric."""
    return "  n/a" if value is None else f"{100 * value:5.1f}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _depth(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def format_summary(summary: dict) -> str:
    """A readable results table: per length, then the headline metrics (percent)."""
    lines = [f"{'length':>6}  {'split':<5} {'policy':>7} {'oracle':>7} {'best K':>6} {'flip':>6}"]
    for n, row in summary["per_length"].items():
        lines.append(
            f"{n:>6}  {row['split']:<5} {_pct(row['policy']):>7} {_pct(row['oracle']):>7} "
            f"{row['best_k']:>6} {_pct(row['flip_rate']):>6}"
        )
    lines.append("")
    gap, front = summary["gap"], summary["front90"]
    flip_range = " (K = {}..{})".format(*summary["flip_range"]) if "flip_range" in summary else ""
    lines.append(
        f"Oracle ID {_percent(summary['oracle_id'])}   Oracle OOD {_percent(summary['oracle_ood'])}   "
        f"Policy OOD {_percent(summary['policy_ood'])}   Gap {'n/a' if gap is None else f'{100 * gap:.1f} pp'}   "
        f"Front@90 {'n/a' if front is None else front}   "
        f"Flip rate {_percent(summary['flip_rate'])}{flip_range}"
    )
    width = max([12, *(len(name) + 1 for name in summary["exits"])])
    lines += ["", f"{'exit':<{width}} {'ID acc':>7} {'OOD acc':>7} {'depth':>6}"]
    for name, row in summary["exits"].items():
        lines.append(
            f"{name:<{width}} {_pct(row['policy_id']):>7} {_pct(row['policy_ood']):>7} {row['mean_depth']:>6.1f}"
        )
    for n, halting in summary.get("halting", {}).items():
        lines.append(f"halting at n={n}: mean depth {halting['mean_depth']:.1f}, entropy {halting['entropy']:.2f}")
    if "halting_inference" in summary:
        h = summary["halting_inference"]
        lines.append(
            f"halting on (rows leave when they halt): ID {_percent(h['on_id'])}, OOD {_percent(h['on_ood'])}, "
            f"mean depth {_depth(h['on_id_depth'])} / {_depth(h['on_ood_depth'])}, {h['on_seconds']:.2f} s; "
            f"halting off (all {h['off_depth']} loops): ID {_percent(h['off_id'])}, OOD {_percent(h['off_ood'])}, "
            f"{h['off_seconds']:.2f} s"
        )
    if "scaling_peak" in summary:
        at = ", ".join(f"{k}: {_pct(v).strip()}" for k, v in summary["scaling_at"].items())
        lines.append(
            f"scaling: peak {_pct(summary['scaling_peak']).strip()}% at {summary['scaling_peak_loops']} "
            f"loops; relative drop to the last loop {_percent(summary['relative_drop'])}; "
            f"non-finite at the last loop {_pct(summary['nonfinite_last']).strip()}%"
        )
        lines.append(f"accuracy by loops: {at}")
    cost = summary.get("training_cost", {})
    if cost.get("block_evals") is not None:
        lines.append(
            f"training: {cost['block_evals']:.2f} block evaluations per step "
            f"({cost['row_loops_mean']:.2f} loops per row)"
        )
    return "\n".join(lines)
