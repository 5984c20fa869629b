"""Halting between deep-supervision segments (docs/methods.md §4.4): TRM's ``act_bce`` and HRM's ``q_halt``.

Both train under deep supervision (``train.segment_loops`` = k, the loops per
segment; ``t_max`` = N_sup·k, so at most N_sup segments)
and decide after every segment from a head on the mean-pooled state, read
*with* gradient as in both sources. A row halts at the first segment its head
says halt (at the N_sup-th at the latest), in training (where the halted row
leaves the batch: the compute TRM saves) and at test time alike.

**act_bce** (TRM). One logit q̂_s; the head learns whether the answer read
after segment s is already wholly right:

    L_s = CE(ŷ_s, y) + w_halt · BCE(q̂_s, 1[ŷ_s = y])        halt when σ(q̂_s) > 0.5

**q_halt** (HRM). Two logits, Q_halt and Q_continue, learned by one-step
Q-learning with the segment's correctness as the reward of halting:

    target(Q_halt,s)     = 1[ŷ_s = y]
    target(Q_continue,s) = σ(max(Q_halt,s+1, Q_continue,s+1))   (σ(Q_halt,N_sup) when s + 1 = N_sup)
    L_s = CE(ŷ_s, y) + w_halt · (BCE(Q_halt,s, ·) + BCE(Q_continue,s, ·))     halt when Q_halt > Q_continue

The Q values at s + 1 come from one more segment run without gradient (as in
HRM); a row at its last segment has no continue option and no Q_continue loss.

Exploration, as in both sources: with probability ``halt_exploration_prob`` a
row may not halt before a segment count drawn uniformly from 2..N_sup. With
``halt_in_training = false`` every row runs all N_sup segments in training (the
head still learns; it decides only at test time); with ``head_gradient = false``
the head reads the state detached (as RL-Halting's does), so the halting loss
trains the head alone.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.model.halting import pooled_answer
from looplab.params import NON_NEGATIVE, UNIT, param
from looplab.schedules.base import StepOutput, register_schedule
from looplab.schedules.halting import LearnedHalting
from looplab.schedules.segments import SegmentEnd, supervise_segments


class QHead(nn.Module):
    """Linear(d, outputs) on the mean-pooled (answer) state; weights 0 and biases −5 at start (no row halts early)."""

    def __init__(self, d_model: int, outputs: int):
        super().__init__()
        self.linear = nn.Linear(d_model, outputs)
        nn.init.zeros_(self.linear.weight)
        nn.init.constant_(self.linear.bias, -5.0)

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """h [B, L, d] (TRM: [B, L, 2d]), valid [B, L] → logits [B, outputs]."""
        return self.linear(pooled_answer(h, valid, self.linear.in_features))


class SegmentHalting(LearnedHalting):
    """Shared parts: the exploration draw, the segment-end test-time rule (T_max, the head's learning rate
    and the width check as for every learned halting rule)."""

    deep_supervision = "required"
    outputs: ClassVar[int] = 1

    @dataclass
    class Params(LearnedHalting.Params):
        halt_exploration_prob: float = param(
            0.1, UNIT, "the share of rows that may not halt before a segment count drawn from 2..N_sup"
        )
        halt_loss_weight: float = param(0.5, NON_NEGATIVE, "w_halt, the halting loss's weight beside the CE")
        halt_in_training: bool = param(
            True, doc="rows leave the batch when the head says halt in training too (false: all N_sup segments)"
        )
        head_gradient: bool = param(
            True, doc="the halting loss trains the model through the head, as in TRM and HRM (false: detached state)"
        )

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        if context.segment_loops < 1 or self.params.t_max % context.segment_loops:
            raise LooplabError(
                f"the {self.name} schedule needs train.segment_loops > 0 dividing schedule.t_max = "
                f"{self.params.t_max}; pass ScheduleContext(segment_loops=...)"
            )

    def make_head(self, d_model):
        return QHead(d_model, self.outputs)

    @property
    def halt_every(self) -> int:
        return self.context.segment_loops

    def halt_score(self, logits: Tensor) -> Tensor:
        """[B] the halting decision's score from the head's [B, outputs] logits: halt where > 0."""
        return logits[:, 0]

    def hazard_logit(self, h, valid):
        return self.halt_score(self.module(h, valid))

    def test_depths(self, lengths, hazard_logits):
        if hazard_logits is None:
            raise ValueError(f"the {self.name} schedule needs hazard logits to choose test depths")
        return first_halt(hazard_logits, self.halt_every, self.params.t_max)

    def _min_segments(self, rows: int, generator: torch.Generator) -> Tensor:
        """[rows] long: the segment count before which each row may not halt (1 unless it explores)."""
        p, n_sup = self.params.halt_exploration_prob, self.params.t_max // self.context.segment_loops

        def draw(n: int) -> Tensor:
            explore = torch.rand(n, generator=generator) < p
            return torch.where(explore, torch.randint(2, max(n_sup, 2) + 1, (n,), generator=generator), 1)

        return self.parallel.draw_rows(draw, rows)

    @abstractmethod
    def halting_loss(self, model, end: SegmentEnd, q: Tensor) -> Tensor:
        """[R] the head's loss at a segment end, from its logits ``q`` [R, outputs]."""

    def training_loss(self, model, batch, generator, probe=False):
        k = self.context.segment_loops
        earliest = self._min_segments(len(batch.tokens), generator).to(batch.tokens.device)
        halted_by_head = []

        def decide(end: SegmentEnd) -> tuple[Tensor, Tensor]:
            states = end.states if self.params.head_gradient else end.states.detach()
            q = self.module(states, end.valid)
            extra = self.params.halt_loss_weight * self.halting_loss(model, end, q)
            halt = (self.halt_score(q.detach()) > 0) & (end.loop // k >= earliest[end.rows])
            if not self.params.halt_in_training:
                halt = torch.zeros_like(halt)
            halted_by_head.append(halt & ~end.last)
            return extra, halt

        cap = torch.full((len(batch.tokens),), self.params.t_max, dtype=torch.long)
        run = supervise_segments(
            model, batch, self.parallel.fork(generator), k, cap, decide, self.context.backprop_loops, probe
        )
        stats = {
            "block_evals": float(run.depth.max()),
            "row_loops_mean": float(run.depth.float().mean()),
            "halt_depth_mean": float(run.depth.float().mean()),
            "segments_mean": float(run.segments.float().mean()),
            "halted_early": float(torch.cat(halted_by_head).float().sum()) / len(batch.tokens),
            "task_loss": float(run.task_loss.mean()),
        }
        return StepOutput(run.loss, stats, run.probe)


def first_halt(hazard_logits: Tensor, every: int, cap: int) -> Tensor:
    """[N] long: the first loop t ≡ 0 (mod ``every``) whose logit is > 0, else min(cap, T).

    Args:
        hazard_logits: [N, T] the head's halting score after every loop (only every ``every``-th is read).
    """
    steps = hazard_logits.shape[1]
    last = min(cap, steps)
    decisions = torch.arange(every, last + 1, every, device=hazard_logits.device)
    if len(decisions) == 0:
        return torch.full((hazard_logits.shape[0],), last, dtype=torch.long, device=hazard_logits.device)
    halts = hazard_logits[:, decisions - 1] > 0
    first = torch.where(halts.any(1), decisions[halts.int().argmax(1)], torch.tensor(last, device=halts.device))
    return first.long()


@register_schedule
class ActBCE(SegmentHalting):
    name = "act_bce"
    label = "act_bce (TRM), T_max = {t_max}"

    def halting_loss(self, model, end, q):
        return F.binary_cross_entropy_with_logits(q[:, 0], end.correct.to(q.dtype), reduction="none")


@register_schedule
class QHalt(SegmentHalting):
    name = "q_halt"
    label = "q_halt (HRM), T_max = {t_max}"
    outputs = 2

    def halt_score(self, logits):
        return logits[:, 0] - logits[:, 1]

    def halting_loss(self, model, end, q):
        halt_loss = F.binary_cross_entropy_with_logits(q[:, 0], end.correct.to(q.dtype), reduction="none")
        going_on = ~end.last
        if not going_on.any():
            return halt_loss
        with torch.no_grad():  # one more segment for Q at s + 1, the bootstrap target
            h = end.states[going_on].detach()
            ctx = end.ctx.select(going_on)
            e = end.e[going_on]
            for _ in range(self.context.segment_loops):
                h = model.step(h, e, ctx)
            q_next = self.module(h, end.valid[going_on])
            final = (end.loop + self.context.segment_loops) >= self.params.t_max
            target = torch.sigmoid(torch.where(torch.as_tensor(final), q_next[:, 0], q_next.max(dim=1).values))
        continue_loss = torch.zeros_like(q[:, 1])
        continue_loss[going_on] = F.binary_cross_entropy_with_logits(q[going_on, 1], target, reduction="none")
        return halt_loss + continue_loss
