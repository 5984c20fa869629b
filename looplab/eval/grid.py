"""acc(n, K) for every evaluated length n and depth K from ONE unroll per batch.

The model is unrolled once to ``max_loops``; after every loop the (cheap)
readout gives the answer at that depth, so the whole grid costs one unroll
instead of one per K. Non-finite logits count as wrong answers, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from looplab.model import LoopedTransformer
from looplab.seeding import derive_generator
from looplab.tasks import Task, TaskBatch
from looplab.train.schedules import Schedule


@dataclass
class LengthOutcome:
    """Per-sample results at one length.

    Attributes:
        length: the instance size n.
        correct: [N, T] bool, whole-answer exact match after K = 1..T loops.
        flips: [N, T-1] bool, the answer after K+1 loops differs from after K.
        policy_depth: [N] int, the schedule's test-time depth, clipped to [1, T].
    """

    length: int
    correct: np.ndarray
    flips: np.ndarray
    policy_depth: np.ndarray

    @property
    def accuracy(self) -> np.ndarray:
        """[T] acc(n, K)."""
        return self.correct.mean(axis=0)

    @property
    def policy_accuracy(self) -> float:
        return float(self.correct[np.arange(len(self.correct)), self.policy_depth - 1].mean())


@torch.no_grad()
def unroll_outcomes(model: LoopedTransformer, batch: TaskBatch, max_loops: int) -> tuple[Tensor, Tensor]:
    """Exact-match per depth and answer flips between consecutive depths.

    Returns:
        correct [B, T] bool and flips [B, T-1] bool.
    """
    answer = batch.answer_mask
    correct, flips, previous = [], [], None
    for h, ctx in model.unroll(batch.tokens, batch.valid, max_loops):
        logits = model.readout(h, ctx)
        finite = torch.isfinite(logits).all(dim=-1)
        prediction = torch.where(finite, logits.argmax(dim=-1), -1)
        hit = (prediction == batch.labels) | ~answer
        correct.append(hit.all(dim=1))
        if previous is not None:
            flips.append(((prediction != previous) & answer).any(dim=1))
        previous = prediction
    empty = torch.zeros(len(batch.tokens), 0, dtype=torch.bool, device=batch.tokens.device)
    return torch.stack(correct, dim=1), torch.stack(flips, dim=1) if flips else empty


def evaluate_lengths(model: LoopedTransformer, task: Task, schedule: Schedule, lengths: list[int],
                     max_loops: int, samples: int, batch_size: int, seed: int) -> list[LengthOutcome]:
    """Evaluate ``samples`` fresh instances per length, drawn from (seed, "eval", n)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    outcomes = []
    for n in lengths:
        generator = derive_generator(seed, "eval", n)
        correct, flips = [], []
        for start in range(0, samples, batch_size):
            batch = task.sample(n, min(batch_size, samples - start), generator).to(device)
            c, f = unroll_outcomes(model, batch, max_loops)
            correct.append(c.cpu())
            flips.append(f.cpu())
        policy = schedule.policy_depth(torch.full((samples,), n)).clamp(1, max_loops)
        outcomes.append(LengthOutcome(n, torch.cat(correct).numpy(), torch.cat(flips).numpy(), policy.numpy()))
    model.train(was_training)
    return outcomes


def grid_frame(outcomes: list[LengthOutcome], train_max: int) -> pd.DataFrame:
    """Long table: one row per (length, loops) with accuracy and flip rate (NaN at the last K)."""
    rows = []
    for outcome in outcomes:
        flip = outcome.flips.mean(axis=0) if outcome.flips.size else np.zeros(0)
        for k, acc in enumerate(outcome.accuracy, start=1):
            rows.append({
                "length": outcome.length,
                "loops": k,
                "accuracy": float(acc),
                "flip_rate": float(flip[k - 1]) if k - 1 < len(flip) else float("nan"),
                "split": "id" if outcome.length <= train_max else "ood",
            })
    return pd.DataFrame(rows)
