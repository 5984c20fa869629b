"""Halting used at inference, batched (docs/methods.md §5.4): rows leave the batch when they halt.

For a schedule with a halting head, every evaluation batch is run twice:

- **halting off**, as TRM and HRM evaluate: every row runs to the cap
  T_max (the schedule's test-depth bound, within ``eval.max_loops``) and is
  read there;
- **halting on**: after every ``halt_every``-th loop the head's logit is read
  and the rows whose logit is > 0 are read out and leave the batch, so the
  batch costs Σᵢ τᵢ loops instead of B·T_max.

For ``act_bce`` and ``q_halt`` the halting-on depth is exactly the depth the
Policy metric reads (the first segment whose head says halt). RL-Halting and
PonderNet are read by argmax π at Policy, which needs every hazard up to
T_max; their halting-on rule is the online one, stop at the first loop whose
hazard σ(z_t) exceeds 0.5, so their halting-on accuracy is not their Policy
accuracy. Wall time is measured on the same batches in the same process.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from looplab.schedules import Schedule
from looplab.schedules.segments import whole_answer_correct
from looplab.tasks import TaskBatch


@torch.no_grad()
def halting_on(model, schedule: Schedule, batch: TaskBatch, cap: int) -> tuple[Tensor, Tensor]:
    """Run ``batch`` with the halt decision applied per row.

    Returns:
        ([B] bool whole-answer correct, [B] long depth at which each row halted).
    """
    batch_size = len(batch.tokens)
    device = batch.tokens.device
    correct = torch.zeros(batch_size, dtype=torch.bool, device=device)
    depth = torch.full((batch_size,), cap, dtype=torch.long, device=device)
    h, e, ctx = model.start(batch.tokens, batch.valid)
    alive = torch.arange(batch_size, device=device)
    for t in range(1, cap + 1):
        h = model.step(h, e, ctx)
        halt = torch.ones(len(alive), dtype=torch.bool, device=device)
        if t < cap:
            halt = schedule.halts(h, batch.valid[alive], t)
            if not halt.any():
                continue
        rows = alive[halt]
        logits = model.readout(h[halt], ctx.select(halt))
        correct[rows] = whole_answer_correct(logits, batch.labels[rows])
        depth[rows] = t
        keep = ~halt
        if not keep.any():
            break
        h, e, ctx, alive = h[keep], e[keep], ctx.select(keep), alive[keep]
    return correct, depth


@torch.no_grad()
def halting_off(model, batch: TaskBatch, cap: int) -> Tensor:
    """[B] bool: every row run to ``cap`` loops and read there."""
    return whole_answer_correct(model(batch.tokens, batch.valid, cap), batch.labels)


def halting_cap(schedule: Schedule, max_loops: int) -> int | None:
    """T_max for the comparison: the schedule's test-depth bound within ``max_loops``; None without a head."""
    bound = type(schedule).test_depth_bound(schedule.params)
    return None if bound is None else min(bound, max_loops)


def halting_frame(model, schedule: Schedule, drawn: dict[int, list[TaskBatch]], max_loops: int) -> pd.DataFrame:
    """Halting on against off per length, on the evaluation's instances (:func:`draw_eval_batches`).

    Returns:
        one row per length: ``samples``; ``on_accuracy``, ``on_depth_mean``, ``on_seconds``;
        ``off_accuracy``, ``off_depth`` (the cap), ``off_seconds``; and ``speedup`` (off / on seconds).
    """
    cap = halting_cap(schedule, max_loops)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows = []
    for n, batches in drawn.items():
        on_correct, on_depth, off_correct = [], [], []
        on_seconds = off_seconds = 0.0
        for batch in batches:
            batch = batch.to(device)
            began = time.perf_counter()
            correct, depth = halting_on(model, schedule, batch, cap)
            on_seconds += time.perf_counter() - began
            began = time.perf_counter()
            off_correct.append(halting_off(model, batch, cap).cpu())
            off_seconds += time.perf_counter() - began
            on_correct.append(correct.cpu())
            on_depth.append(depth.cpu())
        rows.append(
            {
                "length": n,
                "samples": sum(len(batch.tokens) for batch in batches),
                "on_accuracy": float(torch.cat(on_correct).float().mean()),
                "on_depth_mean": float(torch.cat(on_depth).float().mean()),
                "on_seconds": on_seconds,
                "off_accuracy": float(torch.cat(off_correct).float().mean()),
                "off_depth": cap,
                "off_seconds": off_seconds,
                "speedup": off_seconds / on_seconds if on_seconds > 0 else np.nan,
            }
        )
    model.train(was_training)
    return pd.DataFrame(rows)


def halting_summary(frame: pd.DataFrame, train_max: int) -> dict:
    """Halting on against off, in (``id``) and out of (``ood``) distribution: mean accuracy over the lengths,
    the halting-on mean depth, the total wall time of each and their ratio. A split with no length is
    None (undefined), not 0."""
    summary: dict = {"off_depth": int(frame.off_depth.iloc[0])}
    for split, part in (("id", frame[frame.length <= train_max]), ("ood", frame[frame.length > train_max])):
        for column, key in (("on_accuracy", "on"), ("off_accuracy", "off"), ("on_depth_mean", "on_depth")):
            summary[f"{key}_{split}" if key != "on_depth" else f"on_{split}_depth"] = (
                float(part[column].mean()) if len(part) else None
            )
    summary["on_seconds"] = float(frame.on_seconds.sum())
    summary["off_seconds"] = float(frame.off_seconds.sum())
    summary["speedup"] = summary["off_seconds"] / summary["on_seconds"] if summary["on_seconds"] > 0 else None
    return summary
