"""Fine-tuning a wrapped pretrained model (``retrofit.py``): looplab's optimisation step on the model protocol.

A step draws a batch (``input_ids``, ``attention_mask``, ``labels`` [B, T], labels the
token each position predicts, IGNORE where unscored) and asks an *objective* for its
loss — the same :class:`~looplab.schedules.base.StepOutput` looplab's schedules hand
the trainer:

- :func:`last_loop_objective`: the task loss after ``depth_at(step)`` loops, read at the
  scored positions only (the pretrained head is the costliest matmul);
- :func:`schedule_objective`: any looplab schedule's own training objective (its per-row
  depths and depth-supervised loss), run on the wrapped model through the protocol.

Then :func:`looplab.train.gradients.optimisation_step`, the trainer's own: the
regularisers of :mod:`looplab.regularisers` at the probe states ((1 − Σ w)·loss +
Σ w·penalty), clipping, a non-finite loss or gradient refused, AdamW. The plain
next-token fine-tune and the STARS recipes (``retrofit_stars.py``) are callers of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model.protocol import LoopProbe
from looplab.regularisers import Regulariser
from looplab.schedules.base import Schedule, StepOutput
from looplab.schedules.objectives import scored_row_loss
from looplab.tasks import IGNORE, TaskBatch
from looplab.train.gradients import optimisation_step

#: the loss of one step: logits [N, V] at the scored positions and labels [B, T] → a scalar
StepLoss = Callable[[Tensor, Tensor], Tensor]


def next_token_loss(logits: Tensor, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Mean cross-entropy of predicting token i+1 from position i over valid targets; logits [B, T, V]."""
    targets = input_ids[:, 1:]
    if attention_mask is not None:
        targets = targets.masked_fill(~attention_mask[:, 1:].bool(), -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def next_token_batch(input_ids: Tensor, attention_mask: Tensor | None = None) -> dict[str, Tensor]:
    """A batch whose every valid next token is scored: labels[:, i] = input_ids[:, i + 1]."""
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    labels = torch.full_like(input_ids, IGNORE)
    labels[:, :-1] = input_ids[:, 1:].masked_fill(~mask[:, 1:].bool(), IGNORE)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def token_mean_loss(logits_at: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over every scored token of the batch (a long passage weighs more)."""
    return F.cross_entropy(logits_at.float(), labels[labels != IGNORE])


def row_mean_loss(logits_at: Tensor, labels: Tensor) -> Tensor:
    """Mean over rows of each row's mean cross-entropy (:func:`looplab.schedules.objectives.scored_row_loss`),
    so a problem's two answer tokens weigh as much as a passage's many; rows with nothing scored are left out."""
    return scored_row_loss(logits_at, labels)[(labels != IGNORE).any(1)].mean()


def cycled(batches: Iterable[dict[str, Tensor]]) -> Callable[[int], dict[str, Tensor]]:
    """Step s (from 1) → the ((s − 1) mod n)-th of ``batches``."""
    cached = list(batches)
    if not cached:
        raise LooplabError("fine-tuning needs at least one batch")
    return lambda step: cached[(step - 1) % len(cached)]


#: a step's objective: (model, the step's batch on the model's device, step, whether a regulariser
#: needs the probe states) → the loss, its statistics (``loops`` at least) and the probe
Objective = Callable[[RetrofittedLoop, dict[str, Tensor], int, bool], StepOutput]


def last_loop_objective(depth_at: Callable[[int], int] | int, loss: StepLoss = row_mean_loss) -> Objective:
    """The task ``loss`` after ``depth_at(step)`` loops (or one depth for every step), from the logits at
    the scored positions; the probe is the final state."""

    def objective(loop: RetrofittedLoop, batch: dict[str, Tensor], step: int, _probe: bool) -> StepOutput:
        loops = depth_at if isinstance(depth_at, int) else depth_at(step)
        h, e, ctx = loop.start(batch["input_ids"], batch["attention_mask"])
        for _ in range(loops):
            h = loop.step(h, e, ctx)
        task_loss = loss(loop.readout(h, ctx, at=batch["labels"] != IGNORE), batch["labels"])
        return StepOutput(task_loss, {"loops": loops}, LoopProbe(h, e, ctx.valid, ctx))

    return objective


def schedule_objective(schedule: Schedule, generator: torch.Generator) -> Objective:
    """``schedule.training_loss`` on the wrapped model, its depths drawn from ``generator``: a row's size is
    its number of valid tokens. ``loops`` is the mean depth over rows (``row_loops_mean``)."""

    def objective(loop: RetrofittedLoop, batch: dict[str, Tensor], _step: int, probe: bool) -> StepOutput:
        valid = batch["attention_mask"].bool()
        rows = TaskBatch(batch["input_ids"], batch["labels"], valid, valid.sum(1))
        out = schedule.training_loss(loop, rows, generator, probe)
        return StepOutput(out.loss, {"loops": out.stats["row_loops_mean"], **out.stats}, out.probe)

    return objective


def fine_tune(
    loop: RetrofittedLoop,
    batch_at: Callable[[int], dict[str, Tensor]],
    steps: int,
    lr: float,
    objective: Objective | int,
    *,
    regularisers: Sequence[tuple[Regulariser, torch.Generator]] = (),
    lr_factor: Callable[[int], float] | None = None,
    weight_decay: float = 0.0,
    clip: float = 1.0,
    trainable: Iterable[nn.Parameter] | None = None,
    probe: Callable[[int], None] | None = None,
    probe_every: int = 0,
) -> pd.DataFrame:
    """Fine-tune ``loop`` in place; one row per step: step, loops, loss (the task loss), the objective's
    other statistics and each applied regulariser's mean penalty under its name.

    Args:
        batch_at: step s = 1..steps → its batch (``input_ids``, ``attention_mask``, ``labels`` [B, T]).
        objective: the loss of a step (:data:`Objective`); an int r is :func:`last_loop_objective` at r
            loops with :func:`row_mean_loss`.
        regularisers: each with the generator its penalties draw from, applied on every step.
        lr_factor: the learning rate at optimiser step k (from 0) is ``lr · lr_factor(k)``; constant if None.
        clip: gradient-norm clip (0: none). ``trainable``: a subset of the parameters (default all).
        probe: called as ``probe(step)``, the model in eval mode, before the first step and after every
            ``probe_every``-th (a learning curve); it must not draw from the fine-tune's generators.

    The model is left in eval mode.
    """
    if steps < 1:
        raise LooplabError(f"fine-tuning needs steps >= 1, got {steps}")
    if isinstance(objective, int):
        objective = last_loop_objective(objective)
    params = [p for p in (loop.parameters() if trainable is None else trainable) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor or (lambda _: 1.0))
    device = next(loop.parameters()).device
    regularisers = list(regularisers)
    rows = []

    def probe_at(step: int) -> None:
        if probe is not None and probe_every > 0 and step % probe_every == 0:
            loop.eval()
            probe(step)
            loop.train()

    loop.train()
    try:
        probe_at(0)
        for step in range(1, steps + 1):
            batch = {key: value.to(device) for key, value in batch_at(step).items()}
            out = objective(loop, batch, step, bool(regularisers))
            taken = optimisation_step(out, loop, regularisers, optimizer, {"model": params}, clip)
            if not taken.applied:
                what = "loss" if taken.grad_norms is None else "gradient norm"
                value = taken.loss if taken.grad_norms is None else taken.grad_norms["model"]
                raise LooplabError(f"fine-tuning: non-finite {what} {value} at step {step}, not applied")
            decay.step()
            stats = dict(taken.stats)
            rows.append({"step": step, "loops": stats.pop("loops"), "loss": float(out.loss.detach()), **stats})
            probe_at(step)
    finally:
        loop.eval()
    return pd.DataFrame(rows)
