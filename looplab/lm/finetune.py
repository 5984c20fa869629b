"""Fine-tuning a retrofitted loop (``retrofit.py``): the one loop behind every fine-tune of a wrapped model.

A step draws a batch (``input_ids``, ``attention_mask``, ``labels`` [B, T], labels the
token each position predicts, IGNORE where unscored), runs the model ``depth_at(step)``
loops through the looped-model protocol (``start`` / ``step`` / ``readout`` at the
scored positions only), takes the task loss there, adds the regularisers of
:mod:`looplab.regularisers` at the final state exactly as looplab's own trainer does
((1 − Σ w)·loss + Σ w·penalty), and takes the trainer's gradient step
(:func:`looplab.train.gradients.apply_gradients`: clip, refuse a non-finite gradient, AdamW). The plain next-token
fine-tune and the STARS recipes (``retrofit_stars.py``) are two callers of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model.looped import LoopProbe
from looplab.regularisers import Regulariser, regularised_loss
from looplab.schedules.objectives import scored_row_loss
from looplab.tasks import IGNORE
from looplab.train.gradients import apply_gradients

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


def fine_tune(
    loop: RetrofittedLoop,
    batch_at: Callable[[int], dict[str, Tensor]],
    steps: int,
    lr: float,
    depth_at: Callable[[int], int] | int,
    *,
    loss: StepLoss = row_mean_loss,
    regularisers: Sequence[tuple[Regulariser, torch.Generator]] = (),
    lr_factor: Callable[[int], float] | None = None,
    weight_decay: float = 0.0,
    clip: float = 1.0,
    trainable: Iterable[nn.Parameter] | None = None,
    probe: Callable[[int], None] | None = None,
    probe_every: int = 0,
) -> pd.DataFrame:
    """Fine-tune ``loop`` in place; one row per step: step, loops, loss (the task loss), and each applied
    regulariser's mean penalty under its name.

    Args:
        batch_at: step s = 1..steps → its batch (``input_ids``, ``attention_mask``, ``labels`` [B, T]).
        depth_at: step → loops, or one depth for every step.
        loss: the task loss from the logits at the scored positions (default :func:`row_mean_loss`).
        regularisers: each with the generator its penalties draw from, applied on every step.
        lr_factor: the learning rate at optimiser step k (from 0) is ``lr · lr_factor(k)``; constant if None.
        clip: gradient-norm clip (0: none). ``trainable``: a subset of the parameters (default all).
        probe: called as ``probe(step)``, the model in eval mode, before the first step and after every
            ``probe_every``-th (a learning curve); it must not draw from the fine-tune's generators.

    The model is left in eval mode.
    """
    if steps < 1:
        raise LooplabError(f"fine-tuning needs steps >= 1, got {steps}")
    params = [p for p in (loop.parameters() if trainable is None else trainable) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor or (lambda _: 1.0))
    device = next(loop.parameters()).device
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
            loops = depth_at if isinstance(depth_at, int) else depth_at(step)
            h, e, ctx = loop.start(batch["input_ids"], batch["attention_mask"])
            for _ in range(loops):
                h = loop.step(h, e, ctx)
            task_loss = loss(loop.readout(h, ctx, at=batch["labels"] != IGNORE), batch["labels"])
            total, stats = regularised_loss(task_loss, {}, loop, LoopProbe(h, e, ctx.valid, ctx), list(regularisers))
            norms = apply_gradients(total, optimizer, {"model": params}, clip)
            if not all(math.isfinite(norm) for norm in norms.values()):
                raise LooplabError(
                    f"fine-tuning: non-finite gradient norm {norms['model']} at step {step}, not applied"
                )
            decay.step()
            rows.append({"step": step, "loops": loops, "loss": float(task_loss.detach()), **stats})
            probe_at(step)
    finally:
        loop.eval()
    return pd.DataFrame(rows)
