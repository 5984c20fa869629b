"""acc(n, K) for every evaluated length n and depth K from ONE unroll per batch.

The model is unrolled once to ``max_loops``; after every loop the (cheap)
readout gives the answer at that depth, so the whole grid costs one unroll
instead of one per K. Non-finite logits count as wrong answers, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from looplab.model import LoopedTransformer
from looplab.progress import Progress
from looplab.schedules import Schedule
from looplab.seeding import derive_generator
from looplab.tasks import Task, TaskBatch


@dataclass
class LengthOutcome:
    """Per-sample results at one length, from one unroll to T loops.

    Attributes:
        length: the instance size n.
        correct: [N, T] bool, whole-answer exact match after K = 1..T loops.
        flips: [N, T-1] bool, the answer after K+1 loops differs from after K.
        policy_depth: [N] int, the schedule's test-time depth, clipped to [1, T].
        confidence: [N, T] log-probability of the predicted whole answer (−inf if non-finite).
        state_norm: [N, T] ‖h_K‖ over the row's valid positions, per token (RMS of the rows' norms).
        step_norm: [N, T] ‖h_K − h_{K−1}‖, likewise.
        hazard_logits: [N, T] halting-head logits, or None for a model without one.
        exit_depths: exit name → [N] depths, when read back from eval/samples.parquet
            (which keeps the exits' depths instead of the signals they read).
    """

    length: int
    correct: np.ndarray
    flips: np.ndarray
    policy_depth: np.ndarray
    confidence: np.ndarray | None = None
    state_norm: np.ndarray | None = None
    step_norm: np.ndarray | None = None
    hazard_logits: np.ndarray | None = None
    exit_depths: dict[str, np.ndarray] | None = None

    @property
    def step_ratio(self) -> np.ndarray | None:
        """[N, T] ‖h_K − h_{K−1}‖ / ‖h_K‖ (NaN where the state is not finite)."""
        if self.state_norm is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.step_norm / self.state_norm

    @property
    def accuracy(self) -> np.ndarray:
        """[T] acc(n, K)."""
        return self.correct.mean(axis=0)

    def accuracy_at(self, depth: np.ndarray) -> float:
        """Accuracy when sample i is read after depth[i] loops ([N] ints in 1..T)."""
        return float(self.correct[np.arange(len(self.correct)), depth - 1].mean())

    @property
    def policy_accuracy(self) -> float:
        return self.accuracy_at(self.policy_depth)


#: the halting logit of a loop at which a head makes no decision: σ(−10⁴) = 0 without a NaN in π's entropy
NO_HALT = -1e4


@torch.no_grad()
def unroll_outcomes(
    model: LoopedTransformer, batch: TaskBatch, max_loops: int, schedule: Schedule | None = None
) -> dict[str, Tensor]:
    """Everything the readout says about each row at each depth, from one unroll.

    Returns:
        ``correct`` [B, T] bool, ``flips`` [B, T-1] bool, ``confidence``, ``state_norm``
        and ``step_norm`` [B, T], and ``hazard_logits`` [B, T] when ``schedule`` has a
        halting head (:meth:`Schedule.hazard_logit` is not None). A head read every ``halt_every``-th
        loop only has hazard 0 in between (logit −10⁴), so π and its argmax see the decisions it makes.
    """
    answer = batch.answer_mask
    valid = batch.valid.unsqueeze(-1)
    tokens = batch.valid.sum(1).clamp_min(1).double().sqrt()
    signals: dict[str, list[Tensor]] = {"correct": [], "flips": [], "confidence": [], "state_norm": [], "step_norm": []}
    h, e, ctx = model.start(batch.tokens, batch.valid)
    previous = None
    for t in range(1, max_loops + 1):
        h_next = model.step(h, e, ctx)
        # float64 norms: a large but finite float32 state must not overflow into "diverged"
        signals["step_norm"].append(((h_next - h) * valid).flatten(1).double().norm(dim=1) / tokens)
        signals["state_norm"].append((h_next * valid).flatten(1).double().norm(dim=1) / tokens)
        h = h_next
        log_probs = model.readout(h, ctx).float().log_softmax(dim=-1)
        finite = torch.isfinite(log_probs).all(dim=-1)
        best, prediction = log_probs.max(dim=-1)
        prediction = torch.where(finite, prediction, -1)
        best = torch.where(finite, best, float("-inf"))
        signals["correct"].append(((prediction == batch.labels) | ~answer).all(dim=1))
        signals["confidence"].append(torch.where(answer, best, 0.0).sum(dim=1))
        if previous is not None:
            signals["flips"].append(((prediction != previous) & answer).any(dim=1))
        previous = prediction
        hazard = None if schedule is None else schedule.hazard_logit(h, batch.valid)
        if hazard is not None:
            if t % (schedule.halt_every if schedule is not None else 1):
                hazard = torch.full_like(hazard, NO_HALT)
            signals.setdefault("hazard_logits", []).append(hazard.float())
    rows = len(batch.tokens)
    return {
        name: torch.stack(values, dim=1) if values else torch.zeros(rows, 0, dtype=torch.bool)
        for name, values in signals.items()
    }


def eval_batches(task: Task, length: int, samples: int, batch_size: int, seed: int) -> Iterator[TaskBatch]:
    """The evaluation instances of one length, exactly as :func:`evaluate_lengths` draws them.

    One generator per length, ``derive_generator(seed, "eval", length)`` (``seed`` is the
    run's ``run.seed``), draws ⌈samples / batch_size⌉ batches in turn with
    ``task.sample(length, rows, generator)``; the last batch holds the remainder. So
    sample i of length n is the same instance in every run with that seed, task and
    ``eval.batch_size``, whatever the model.
    """
    generator = derive_generator(seed, "eval", length)
    for start in range(0, samples, batch_size):
        yield task.sample(length, min(batch_size, samples - start), generator)


def draw_eval_batches(
    task: Task, lengths: list[int], samples: int, batch_size: int, seed: int
) -> dict[int, list[TaskBatch]]:
    """Every length's :func:`eval_batches`, drawn once, for evaluations that read the same instances twice."""
    return {n: list(eval_batches(task, n, samples, batch_size, seed)) for n in lengths}


def evaluate_lengths(
    model: LoopedTransformer,
    task: Task,
    schedule: Schedule,
    lengths: list[int],
    max_loops: int,
    samples: int,
    batch_size: int,
    seed: int,
    progress: bool = False,
    drawn: dict[int, list[TaskBatch]] | None = None,
) -> list[LengthOutcome]:
    """Evaluate ``samples`` fresh instances per length (drawn by :func:`eval_batches`).

    ``progress`` shows a bar over the evaluation batches (on a terminal). ``drawn`` holds the same
    instances already drawn (:func:`draw_eval_batches`), so a slow generator is not run twice.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    outcomes = []
    bar = Progress("eval", len(lengths) * math.ceil(samples / batch_size), unit="batch", enabled=progress)
    for n in lengths:
        parts: dict[str, list[Tensor]] = {}
        for batch in drawn[n] if drawn is not None else eval_batches(task, n, samples, batch_size, seed):
            for name, value in unroll_outcomes(model, batch.to(device), max_loops, schedule).items():
                parts.setdefault(name, []).append(value.cpu())
            bar.advance(detail=f"length {n}")
        signals = {name: torch.cat(values) for name, values in parts.items()}
        hazards = signals.get("hazard_logits")
        policy = schedule.test_depths(torch.full((samples,), n), hazards).clamp(1, max_loops)
        outcomes.append(
            LengthOutcome(
                n,
                signals["correct"].numpy(),
                signals["flips"].numpy(),
                policy.numpy(),
                signals["confidence"].numpy(),
                signals["state_norm"].numpy(),
                signals["step_norm"].numpy(),
                None if hazards is None else hazards.numpy(),
            )
        )
    bar.close()
    model.train(was_training)
    return outcomes


def grid_frame(outcomes: list[LengthOutcome], train_max: int) -> pd.DataFrame:
    """Long table: one row per (length, loops) with accuracy and flip rate (NaN at the last K)."""
    rows = []
    for outcome in outcomes:
        flip = outcome.flips.mean(axis=0) if outcome.flips.size else np.zeros(0)
        for k, acc in enumerate(outcome.accuracy, start=1):
            rows.append(
                {
                    "length": outcome.length,
                    "loops": k,
                    "accuracy": float(acc),
                    "flip_rate": float(flip[k - 1]) if k - 1 < len(flip) else float("nan"),
                    "split": "id" if outcome.length <= train_max else "ood",
                }
            )
    return pd.DataFrame(rows)


def policy_depth_frame(outcomes: list[LengthOutcome]) -> pd.DataFrame:
    """Histogram of the test-time policy depth: one row per (length, depth) with its sample count."""
    rows = []
    for outcome in outcomes:
        depths, counts = np.unique(outcome.policy_depth, return_counts=True)
        rows += [{"length": outcome.length, "depth": int(d), "count": int(c)} for d, c in zip(depths, counts)]
    return pd.DataFrame(rows, columns=["length", "depth", "count"])
