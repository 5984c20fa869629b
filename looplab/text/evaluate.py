"""Validation loss of a looped LM at every loop count, from ONE unroll per batch.

The model is unrolled once to ``max_loops``; after each loop the readout gives
next-byte logits for every position, so the whole loss-vs-loops curve costs
one unroll. Non-finite logits never crash: such a token counts as an infinite
loss and a wrong prediction, and the ``nonfinite`` column reports the fraction.

Columns: ``loops`` (1..max_loops), ``loss`` (mean next-byte cross-entropy,
nats), ``bits_per_byte`` (loss / ln 2), ``accuracy`` (next-byte top-1) and
``nonfinite`` (fraction of tokens with non-finite logits).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import torch

from looplab.config import DEFAULT_SAMPLES
from looplab.errors import LooplabError
from looplab.eval.grid import evaluate_lengths
from looplab.experiment import Experiment
from looplab.io import atomic_write
from looplab.memory import check_fits, eval_bytes, lm_eval_bytes
from looplab.model import LoopedTransformer
from looplab.model.protocol import readouts_by_loops
from looplab.plotting import pyplot, save_figure
from looplab.progress import Progress
from looplab.schedules import DepthRule
from looplab.seeding import derive_generator
from looplab.tasks import IGNORE, TASKS, make_task
from looplab.tasks.reasoning import MIXTURE_WINDOW
from looplab.tasks.text import KJVText
from looplab.text.reasoning import (
    REASONING_FILE,
    SCALING_PLOT,
    plot_loop_scaling,
    reasoning_columns,
    reasoning_grid,
    scaling_summary,
    spectral_by_loops,
)

EVAL_DIR = "eval"
CSV_FILE = "lm_loops.csv"
PLOT_FILE = "lm_loops.png"
SUMMARY_FILE = "lm_summary.json"


def next_token_nll(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per scored position, from logits [N, V] and targets [N]: the negative log-likelihood in float64
    (inf where the logits are not finite), whether the argmax is the target (never where not finite),
    and whether the logits are finite — each [N]."""
    log_probs = logits.float().log_softmax(dim=-1)
    finite = torch.isfinite(log_probs).all(dim=-1)
    token_nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    token_nll = torch.where(finite, token_nll, float("inf")).double()
    return token_nll, (log_probs.argmax(dim=-1) == target) & finite, finite


@torch.no_grad()
def lm_loss_by_loops(
    model: LoopedTransformer,
    task: KJVText,
    window: int,
    samples: int,
    max_loops: int,
    seed: int,
    split: str = "val",
    batch_size: int = 64,
    progress: bool = False,
) -> pd.DataFrame:
    """Loss, bits per byte and next-byte accuracy after 1..max_loops loops.

    ``samples`` windows of ``window`` bytes come from ``split``, drawn with
    ``derive_generator(seed, "lm-eval")``, so every model sees the same text.
    ``progress`` counts (batch, loop) steps with an ETA, on a terminal or as a line every ~10 s.
    """
    if min(window, samples, max_loops, batch_size) < 1:
        raise LooplabError("window, samples, max_loops and batch_size must all be >= 1")
    device = next(model.parameters()).device
    generator = derive_generator(seed, "lm-eval")
    nll = torch.zeros(max_loops, dtype=torch.float64)
    correct = torch.zeros(max_loops, dtype=torch.float64)
    nonfinite = torch.zeros(max_loops, dtype=torch.float64)
    was_training = model.training
    model.eval()
    bar = Progress("eval", math.ceil(samples / batch_size) * max_loops, unit="loop", enabled=progress)
    try:
        for start in range(0, samples, batch_size):
            tokens, labels = task.sample_split(window, min(batch_size, samples - start), generator, split)
            tokens, labels = tokens.to(device), labels.to(device)
            valid = torch.ones_like(tokens, dtype=torch.bool)
            scored = labels != IGNORE  # every byte position; the start token predicts nothing
            for t, (_, logits) in enumerate(readouts_by_loops(model, tokens, valid, max_loops, at=scored)):
                token_nll, hit, finite = next_token_nll(logits, labels[scored])
                nll[t] += token_nll.sum().cpu()
                correct[t] += hit.sum().cpu()
                nonfinite[t] += (~finite).sum().cpu()
                bar.advance(detail=f"loop {t + 1}")
    finally:
        bar.close()
        model.train(was_training)
    count = samples * window  # scored positions: one per byte of every window
    loss = (nll / count).tolist()
    return pd.DataFrame(
        {
            "loops": range(1, max_loops + 1),
            "loss": loss,
            "bits_per_byte": [x / math.log(2) for x in loss],
            "accuracy": (correct / count).tolist(),
            "nonfinite": (nonfinite / count).tolist(),
        }
    )


def lm_summary(frame: pd.DataFrame, training_depth: int | None) -> dict:
    """Loss at the training depth, the best loss and its loop count, and the loss at ``max_loops``."""

    def at(k: int | None) -> float | None:
        rows = frame.loc[frame.loops == k, "loss"]
        return float(rows.iloc[0]) if k is not None and len(rows) else None

    best = int(frame.loss.idxmin())
    last = int(frame.loops.max())
    return {
        "training_depth": training_depth,
        "loss_at_training_depth": at(training_depth),
        "best_loss": float(frame.loss.iloc[best]),
        "best_loops": int(frame.loops.iloc[best]),
        "max_loops": last,
        "loss_at_max_loops": at(last),
        "bits_per_byte_at_training_depth": None if at(training_depth) is None else at(training_depth) / math.log(2),
        "nonfinite_loops": [int(k) for k in frame.loops[frame.nonfinite > 0]],
    }


def plot_lm_loops(
    frame: pd.DataFrame,
    path: Path,
    training_depth: int | None,
    title: str = "",
    *,
    token: str = "byte",
    line: str = "validation loss",
    depth_label: str = "trained at",
) -> None:
    """Loss against loops (log x), the training depth marked (``token`` names the unit of the y axis,
    ``line`` the curve, ``depth_label`` the marked depth: a native looped LM's own loop count)."""
    plt = pyplot()

    fig, axis = plt.subplots(figsize=(6, 3.8))
    finite = frame[frame.loss.map(math.isfinite)]
    axis.plot(finite.loops, finite.loss, marker=".", label=line)
    if training_depth is not None:
        axis.axvline(training_depth, color="grey", linestyle="--", label=f"{depth_label} {training_depth}")
    axis.set_xscale("log")
    axis.set_xlabel("loops")
    axis.set_ylabel(f"next-{token} loss (nats)")
    axis.set_title(title or f"{line} vs loops")
    axis.legend()
    save_figure(fig, path)


def training_depth(exp: Experiment) -> int | None:
    """The depth the run's schedule reads at test time (None for learned-halting schedules)."""
    if not isinstance(exp.schedule, DepthRule):
        return None
    window = torch.tensor([exp.config.task.train_max])
    return int(exp.schedule.policy_depth(window)[0])


def with_reasoning(exp: Experiment, frame: pd.DataFrame, samples: int, batch_size: int):
    """``frame`` with the reasoning columns of :mod:`looplab.text.reasoning`, and the per-size grid."""
    cfg, task = exp.config, exp.task.reasoning
    max_loops = len(frame)
    outcomes = evaluate_lengths(
        exp.model, task, exp.schedule, cfg.task.eval_lengths, max_loops, samples, batch_size, cfg.run.seed
    )
    spectral = spectral_by_loops(exp.model, task, cfg.task.train_max, max_loops, cfg.run.seed)
    columns = reasoning_columns(outcomes, cfg.task.train_max, spectral)
    return pd.concat([frame, columns], axis=1), reasoning_grid(outcomes, cfg.task.train_max)


def evaluate_lm_run(
    run_dir: str | Path,
    max_loops: int = 64,
    samples: int = DEFAULT_SAMPLES,
    out: str | Path | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> dict:
    """Write ``lm_loops.csv``, ``lm_loops.png`` and ``lm_summary.json`` for a trained KJV run.

    The window is the run's ``task.train_max`` (``kjv``) or the mixture's window
    (``kjv_arithmetic``, which also gets the reasoning columns, ``reasoning_loops.csv``,
    ``lm_scaling.png`` and the summary's ``scaling`` entry); ``out`` defaults to ``RUN_DIR/eval``.
    Returns the summary (see :func:`lm_summary`).
    """
    run_dir = Path(run_dir)
    exp = Experiment.from_run(run_dir)
    if exp.task.exact_match:
        corpora = sorted(name for name, task in TASKS.items() if not task.exact_match)
        raise LooplabError(
            f"{run_dir} trains task {exp.config.task.name!r}; LM evaluation needs a language-modelling task: "
            f"{', '.join(corpora)}"
        )
    reasoning = exp.task.problems is not None
    window = MIXTURE_WINDOW if reasoning else exp.config.task.train_max
    what = f"evaluating {samples} windows x {max_loops} loops"
    needed = lm_eval_bytes(exp.config, exp.task, window, samples, max_loops, batch_size)
    if reasoning:  # the problems' per-sample outcomes are held for every loop before any file is written
        lengths = exp.config.task.eval_lengths
        what = f"evaluating {samples} problems x {max_loops} loops x {len(lengths)} sizes"
        needed += eval_bytes(exp.config, exp.task.reasoning, lengths, max_loops, samples)
    check_fits(what, needed, exp.config.run.device, "use fewer --lm-loops or --samples")
    if progress:
        print(f"eval: {run_dir} at {exp.checkpoint}: {samples} windows of {window} bytes, loops 1..{max_loops}")
    frame = lm_loss_by_loops(
        exp.model, exp.task, window, samples, max_loops, exp.config.run.seed, batch_size=batch_size, progress=progress
    )
    depth = training_depth(exp)
    summary = {
        **lm_summary(frame, depth),
        "window": window,
        "samples": samples,
        "split": "val",
        "checkpoint": exp.checkpoint,
    }
    out = Path(out) if out is not None else run_dir / EVAL_DIR
    out.mkdir(parents=True, exist_ok=True)
    if reasoning:
        frame, grid = with_reasoning(exp, frame, samples, batch_size)
        summary["scaling"] = scaling_summary(frame, depth)
        atomic_write(out / REASONING_FILE, lambda p: grid.to_csv(p, index=False))
        plot_loop_scaling(frame, out / SCALING_PLOT, depth, f"{run_dir.name}: loop scaling")
    atomic_write(out / CSV_FILE, lambda p: frame.to_csv(p, index=False))
    plot_lm_loops(frame, out / PLOT_FILE, depth, f"{run_dir.name}: validation loss")  # PNG + PDF, atomically
    atomic_write(out / SUMMARY_FILE, lambda p: p.write_text(json.dumps(summary, indent=2)))
    return summary


def text_loops(config, lm_loops: int | None = None) -> int | None:
    """The one decision of which evaluator a run gets: the loops 1..T at which the loss-against-loops
    evaluation reads it (a text task, at ``lm_loops`` or its own eval.max_loops; or any run when
    ``lm_loops`` asks for it), or None for the exact-match grid."""
    if lm_loops is not None:
        if lm_loops < 1:
            raise LooplabError(f"--lm-loops must be >= 1, got {lm_loops}")
        return lm_loops
    return None if make_task(config.task.name, config.task.alphabet).exact_match else config.eval.max_loops


def evaluate_any_run(run_dir: str | Path, scaling: bool = False, progress: bool = False) -> dict:
    """A run's evaluation by its task's kind (:func:`text_loops`), at the run's own [eval] settings: the
    exact-match grid (with ``scaling``, the test-time scaling curve too) or, for a text task, the loss
    against 1..eval.max_loops loops (``scaling`` is what that evaluation is)."""
    from looplab.eval.run import evaluate_run
    from looplab.rundir import load_run_config

    config = load_run_config(run_dir)
    loops = text_loops(config)
    if loops is None:
        return evaluate_run(run_dir, scaling=scaling, progress=progress)
    return evaluate_lm_run(run_dir, max_loops=loops, samples=config.eval.samples, progress=progress)
