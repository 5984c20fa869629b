"""Deep supervision (docs/methods.md §4.3): an unroll cut into segments, a loss at every segment's end.

With ``train.segment_loops`` = k > 0 a row's unroll is cut into segments of k
loops (its last segment ends at its depth τ, so it may be shorter). At every
segment's end the answer is read and supervised, and the state is detached, so
no gradient crosses a segment boundary; ``train.backprop_loops`` = g > 0 keeps
the gradient through each segment's last g loops only (TRM keeps it through
the last of its recursions). A row leaves the batch when it is done, so a
step costs Σᵢ τᵢ loops.

Who decides that a row is done is the schedule: a rule schedule at its depth
τ, a segment-halting schedule (``act_bce``, ``q_halt``) when its head says
halt. The loss is each row's mean over its segments, then the mean over rows
(the ``multi_depth`` average). TRM and HRM instead take an optimiser step after
every segment; here the segments' gradients are summed into one step, which is
the same first-order update and keeps clipping, data parallelism, regularisers
and exact resume unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.model.protocol import LoopProbe
from looplab.schedules.objectives import per_row_loss
from looplab.tasks import IGNORE, TaskBatch


@dataclass
class SegmentEnd:
    """The rows whose segment ends after loop ``loop``: what a schedule decides halting from.

    Attributes:
        loop: the loop just run (1-based); the segment's index is ⌈loop / k⌉.
        rows: [R] long, the rows' indices in the batch.
        states: [R, L, d] their states (with gradient through the segment).
        logits: [R, L, V] their answers read out.
        task_loss: [R] cross-entropy over each row's answer positions.
        correct: [R] bool, whole-answer exact match.
        last: [R] bool, the row cannot run another segment (its depth cap is reached).
        e, ctx, valid: the rows' injected input, attention context and mask, to run them further.
    """

    loop: int
    rows: Tensor
    states: Tensor
    logits: Tensor
    task_loss: Tensor
    correct: Tensor
    last: Tensor
    e: Tensor
    ctx: object
    valid: Tensor


#: (a segment end) → ([R] loss per row beyond its task loss, [R] bool: the row halts here)
SegmentDecision = Callable[[SegmentEnd], tuple[Tensor, Tensor]]


@dataclass
class SegmentRun:
    """What a deeply supervised unroll returns.

    Attributes:
        loss: scalar, the mean over rows of each row's mean segment loss.
        depth: [B] long, the loop at which each row left.
        segments: [B] long, how many segments each row ran.
        task_loss: [B] each row's mean cross-entropy over its segments (detached).
        probe: each row's final state, when asked.
    """

    loss: Tensor
    depth: Tensor
    segments: Tensor
    task_loss: Tensor
    probe: LoopProbe | None


def whole_answer_correct(logits: Tensor, labels: Tensor) -> Tensor:
    """[R] bool: every answer position of each row predicted right (logits [R, L, V], labels [R, L]);
    a position whose logits are not finite counts as wrong, as in the evaluation grid."""
    answer = labels != IGNORE
    prediction = torch.where(torch.isfinite(logits).all(dim=-1), logits.argmax(-1), -1)
    return ((prediction == labels) | ~answer).all(dim=-1)


def supervise_segments(
    model,
    batch: TaskBatch,
    generator: torch.Generator | None,
    segment_loops: int,
    cap: Tensor,
    decide: SegmentDecision,
    grad_loops: int = 0,
    probe: bool = False,
) -> SegmentRun:
    """Unroll every row segment by segment until ``decide`` halts it or its ``cap`` is reached.

    Args:
        model: a looped model (``start``, ``step``, ``readout``).
        batch: this rank's rows.
        segment_loops: k, the loops per segment.
        cap: [B] long, the deepest each row may run; a segment that would pass it ends there.
        decide: the schedule's rule at every segment end (its extra loss and the rows that halt).
        grad_loops: g > 0 keeps the gradient through each segment's last g loops only.
        probe: also return each row's final state.
    """
    batch_size = len(batch.tokens)
    device = batch.tokens.device
    cap = cap.to(device)
    h, e, ctx = model.start(batch.tokens, batch.valid, generator)
    e_rows, start_ctx = e, ctx
    alive = torch.arange(batch_size, device=device)
    depth = torch.zeros(batch_size, dtype=torch.long, device=device)
    segments = torch.zeros_like(depth)
    loss_sum = h.new_zeros(batch_size, dtype=torch.float32)
    task_sum = torch.zeros(batch_size, dtype=torch.float32, device=device)
    finals, final_rows = [], []
    t = 0
    while len(alive):
        t += 1
        # the loop that closes each running row's current segment (its cap may close it early)
        segment_end = torch.minimum(torch.full_like(alive, -(-t // segment_loops) * segment_loops), cap[alive])
        if t > 1 and (t - 1) % segment_loops == 0:  # a segment starts: no gradient reaches the one before
            h = h.detach()
        elif grad_loops > 0:
            cut = (segment_end - (t - 1)) == grad_loops
            if cut.any():
                h = torch.where(cut.view(-1, 1, 1), h.detach(), h)
        h = model.step(h, e, ctx)
        ending = segment_end == t
        if not ending.any():
            continue
        local = ending.nonzero(as_tuple=True)[0]
        rows = alive[local]
        states = h[local]
        row_ctx = ctx.select(local)
        logits = model.readout(states, row_ctx)
        labels = batch.labels[rows]
        task_loss = per_row_loss(logits, labels)
        end = SegmentEnd(
            t,
            rows,
            states,
            logits,
            task_loss,
            whole_answer_correct(logits.detach(), labels),
            cap[rows] == t,
            e[local],
            row_ctx,
            batch.valid[rows],
        )
        extra, halt = decide(end)
        halt = halt | end.last
        loss_sum = loss_sum.index_add(0, rows, (task_loss + extra).float())
        task_sum = task_sum.index_add(0, rows, task_loss.detach().float())
        segments[rows] += 1
        depth[rows] = t
        if probe and halt.any():
            finals.append(states[halt])
            final_rows.append(rows[halt])
        keep = torch.ones(len(alive), dtype=torch.bool, device=device)
        keep[local[halt]] = False
        if not keep.all():
            h, e, ctx, alive = h[keep], e[keep], ctx.select(keep), alive[keep]
    per_segment = segments.clamp_min(1).float()
    found = None
    if probe:
        order = torch.argsort(torch.cat(final_rows))
        found = LoopProbe(torch.cat(finals)[order], e_rows, batch.valid, start_ctx)
    return SegmentRun((loss_sum / per_segment).mean(), depth, segments, task_sum / per_segment, found)
