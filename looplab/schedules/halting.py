"""Learned halting schedules (docs/methods.md §4): RL-Halting and PonderNet.

**RL-Halting** (``rl_halting``). The hazard head reads the *detached* pooled
state, so it never changes θ. Each row draws its depth τ ~ π_stop; the model
is trained by cross-entropy at τ only, and the head by REINFORCE:

    R = −CE(ŷ_τ, y)                  per row
    b ← m·b + (1 − m)·mean(R)        moving-average baseline (m = 0.9)
    L_halt = −(R − b)·log π(τ|x) − λ_ent·H(π(·|x))

Two estimators of the entropy term:

- ``exact``: every row is unrolled to T_max to get all hazards, π is exact, τ
  is drawn from it and H(π) is differentiated directly. Costs B × T_max loops.
- ``sampled``: τ is drawn on the fly — at loop t each running row stops with
  probability r_t (the same law as π) and leaves the batch, so the cost is
  Σᵢ τᵢ loops. The entropy bonus is folded into the reward,
  R' = R − λ_ent·log π(τ), an unbiased estimator of the same gradient because
  ∇H = −E[log π(τ) ∇log π(τ)].

The baseline starts at the first batch's mean reward (rather than 0) so the
first updates are not all pushed one way.

**PonderNet** (``pondernet``). The head reads the state *with* gradient; every
row is read out at every depth and the loss is Σ_t p_t·L_t + β·KL(p ‖ Geometric(λ_p)).

Both read out at test time at argmax_t π^(T_test)(t|x).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.model.halting import (
    HazardHead,
    entropy,
    log_geometric_prior,
    log_halting_distribution,
    policy_depth,
)
from looplab.model.protocol import LoopProbe
from looplab.params import FRACTION, NON_NEGATIVE, OPEN_UNIT, POSITIVE, at_least, one_of, param
from looplab.schedules.base import Schedule, StepOutput, register_schedule
from looplab.schedules.objectives import per_row_loss

ENTROPY_MODES = ("exact", "sampled")


@dataclass
class HaltingSample:
    """One draw of halting depths for a batch (:meth:`RLHalting.sample`).

    Attributes:
        states: [B, L, d] each row's state h_τ after its τ loops (with gradient).
        depth: [B] long, the drawn τ ∈ 1..T_max.
        log_prob: [B] log π(τ | x), differentiable in the halting head.
        entropy: [B] H(π(·|x)) (``exact``) or its one-sample estimate −log π(τ|x) (``sampled``).
        e: [B, L, d] the injected input.
        ctx: the context ``start`` built for the batch (a family's may hold what the readout reads, as Parcae's
            token ids).
        log_pi: [B, T_max] the whole log π(·|x) when every row was unrolled to T_max
            (``exact``), else None (use :meth:`RLHalting.distribution`).
    """

    states: Tensor
    depth: Tensor
    log_prob: Tensor
    entropy: Tensor
    e: Tensor
    ctx: Any
    log_pi: Tensor | None = None


class LearnedHalting(Schedule):
    """Shared parts: T_max, the halting head and its learning rate, and the argmax-π test-time rule."""

    @dataclass
    class Params:
        t_max: int = param(20, at_least(1), "T_max: the deepest a row may run, in training and at test time")
        lr_scale: float = param(1.0, POSITIVE, "the halting head's learning rate as a multiple of the model's")

    @classmethod
    def test_depth_bound(cls, params):
        return params.t_max

    @classmethod
    def training_depth(cls, params, deepest):
        return params.t_max

    @property
    def lr_scale(self) -> float:
        return self.params.lr_scale

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        if context.d_model is None:
            raise LooplabError(
                f"the {self.name} schedule needs the model width for its halting head; "
                "pass ScheduleContext(d_model=...)"
            )
        self.module = self.make_head(context.d_model)

    def make_head(self, d_model: int) -> nn.Module:
        """The halting head, trained and checkpointed with the model."""
        return HazardHead(d_model)

    def hazard_logit(self, h, valid):
        return self.module(h, valid)

    def test_depths(self, lengths, hazard_logits):
        if hazard_logits is None:
            raise ValueError(f"the {self.name} schedule needs hazard logits to choose test depths")
        return policy_depth(hazard_logits)


@register_schedule
class RLHalting(LearnedHalting):
    name = "rl_halting"
    label = "RL-Halting, T_max = {t_max}, λ_ent = {entropy_weight:g}"

    @dataclass
    class Params(LearnedHalting.Params):
        entropy_weight: float = param(0.001, NON_NEGATIVE, "λ_ent, the entropy bonus's weight")
        entropy_mode: str = param("sampled", one_of(*ENTROPY_MODES), "the entropy term's estimator")
        baseline_momentum: float = param(0.9, FRACTION, "m of the reward baseline's moving average")

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        self.baseline: float | None = None

    def state_dict(self) -> dict:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        self.baseline = state.get("baseline")

    def sample(self, model, batch, generator: torch.Generator) -> HaltingSample:
        """Draw τ ~ π(·|x) for every row of ``batch`` and unroll each row to its τ (``entropy_mode`` decides how).

        The uniforms behind the draws are drawn for the global batch and cut to this
        rank's rows (:meth:`Parallel.draw_rows`), so a data-parallel rank draws the
        depths single-process training would.
        """
        if self.params.entropy_mode == "exact":
            return self._sample_exact(model, batch, generator)
        return self._sample_on_the_fly(model, batch, generator)

    @torch.no_grad()
    def distribution(self, model, batch, generator: torch.Generator | None = None) -> Tensor:
        """[B, T_max] log π(t | x) of every row, from one unroll to T_max (no gradient)."""
        h, e, ctx = model.start(batch.tokens, batch.valid, generator)
        logits = []
        for _ in range(self.params.t_max):
            h = model.step(h, e, ctx)
            logits.append(self.module(h, batch.valid))
        return log_halting_distribution(torch.stack(logits, dim=1))

    def training_loss(self, model, batch, generator, probe=False):
        drawn = self.sample(model, batch, generator)
        states, depth, log_pi_tau, halt_entropy, e = drawn.states, drawn.depth, drawn.log_prob, drawn.entropy, drawn.e
        row_loss = per_row_loss(model.readout(states, drawn.ctx), batch.labels)
        reward = -row_loss.detach()
        if self.params.entropy_mode == "sampled":
            reward = reward - self.params.entropy_weight * log_pi_tau.detach()
        if self.baseline is None:
            self.baseline = float(reward.mean())
        advantage = reward - self.baseline
        halt_loss = -(advantage * log_pi_tau).mean()
        if self.params.entropy_mode == "exact":
            halt_loss = halt_loss - self.params.entropy_weight * halt_entropy.mean()
        m = self.params.baseline_momentum
        self.baseline = m * self.baseline + (1 - m) * float(reward.mean())
        stats = {
            "block_evals": float(self.params.t_max if self.params.entropy_mode == "exact" else depth.max()),
            "row_loops_mean": float(self.params.t_max if self.params.entropy_mode == "exact" else depth.float().mean()),
            "halt_depth_mean": float(depth.float().mean()),
            "halt_entropy": float(halt_entropy.detach().mean()),
            "halt_loss": float(halt_loss.detach()),
            "baseline": self.baseline,
            "task_loss": float(row_loss.detach().mean()),
        }
        probed = LoopProbe(states, e, batch.valid, drawn.ctx) if probe else None
        return StepOutput(row_loss.mean() + halt_loss, stats, probed)

    def _sample_exact(self, model, batch, generator):
        """Unroll every row to T_max; draw τ from the exact π.

        Returns:
            the sample, with the whole distribution ``log_pi``.
        """
        t_max = self.params.t_max
        uniform = self.parallel.draw_rows(
            lambda n: torch.rand(n, generator=generator, dtype=torch.float64), len(batch.tokens)
        )
        h, e, ctx = model.start(batch.tokens, batch.valid, self.parallel.fork(generator))
        states, logits = [], []
        for _ in range(t_max):
            h = model.step(h, e, ctx)
            states.append(h)
            logits.append(self.module(h.detach(), batch.valid))
        log_pi = log_halting_distribution(torch.stack(logits, dim=1))
        # inverse CDF: τ is the first t whose cumulative π reaches the row's uniform
        below = log_pi.detach().double().exp().cumsum(1) < uniform.to(h.device)[:, None]
        depth = below.sum(1).clamp_max(t_max - 1) + 1
        rows = torch.arange(len(depth), device=h.device)
        chosen = torch.stack(states)[depth - 1, rows]
        return HaltingSample(chosen, depth, log_pi[rows, depth - 1], entropy(log_pi), e, ctx, log_pi)

    def _sample_on_the_fly(self, model, batch, generator):
        """Stop each running row at loop t with probability r_t; stopped rows leave the batch.

        Returns:
            the sample; its entropy is the one-sample estimate −log π(τ), for logging.
        """
        t_max = self.params.t_max
        uniform = self.parallel.draw_rows(
            lambda n: torch.rand(n, max(t_max - 1, 0), generator=generator), len(batch.tokens)
        ).to(batch.tokens.device)  # [B, T_max − 1]
        h, e_rows, start_ctx = model.start(batch.tokens, batch.valid, self.parallel.fork(generator))
        e, ctx = e_rows, start_ctx
        batch_size = len(batch.tokens)
        alive = torch.arange(batch_size, device=h.device)
        survived = h.new_zeros(batch_size)  # Σ_{i<t} log(1 − r_i) of the running rows
        finished_states, finished_rows, finished_log_pi, finished_depth = [], [], [], []
        for t in range(1, t_max + 1):
            h = model.step(h, e, ctx)
            if t < t_max:
                hazard_logit = self.module(h.detach(), batch.valid[alive])
                stop = uniform[alive, t - 1] < torch.sigmoid(hazard_logit.detach())
                log_pi = survived + F.logsigmoid(hazard_logit)
                survived = survived + F.logsigmoid(-hazard_logit)
            else:
                stop = torch.ones(len(alive), dtype=torch.bool, device=h.device)
                log_pi = survived
            finished_states.append(h[stop])
            finished_rows.append(alive[stop])
            finished_log_pi.append(log_pi[stop])
            finished_depth.append(torch.full((int(stop.sum()),), t, device=h.device))
            keep = ~stop
            if not keep.any():
                break
            h, e, ctx = h[keep], e[keep], ctx.select(keep)
            alive, survived = alive[keep], survived[keep]
        # Put the rows back in batch order so they line up with labels and masks.
        order = torch.argsort(torch.cat(finished_rows))
        log_pi_tau = torch.cat(finished_log_pi)[order]
        states, depth = torch.cat(finished_states)[order], torch.cat(finished_depth)[order]
        return HaltingSample(states, depth, log_pi_tau, -log_pi_tau, e_rows, start_ctx)


@register_schedule
class PonderNet(LearnedHalting):
    name = "pondernet"
    label = "PonderNet, T_max = {t_max}"

    @dataclass
    class Params(LearnedHalting.Params):
        ponder_prior: float = param(0.2, OPEN_UNIT, "λ_p, the geometric prior's rate")
        ponder_beta: float = param(0.01, NON_NEGATIVE, "β, the weight of KL(p ‖ prior)")

    def training_loss(self, model, batch, generator, probe=False):
        t_max = self.params.t_max
        h, e, ctx = model.start(batch.tokens, batch.valid, self.parallel.fork(generator))
        logits, losses = [], []
        for _ in range(t_max):
            h = model.step(h, e, ctx)
            logits.append(self.module(h, batch.valid))
            losses.append(per_row_loss(model.readout(h, ctx), batch.labels))
        log_p = log_halting_distribution(torch.stack(logits, dim=1))
        p = log_p.exp()
        task_loss = (p * torch.stack(losses, dim=1)).sum(1).mean()
        prior = log_geometric_prior(self.params.ponder_prior, t_max, device=h.device)
        kl = (p * (log_p - prior)).sum(1).mean()
        depths = torch.arange(1, t_max + 1, device=h.device, dtype=p.dtype)
        stats = {
            "block_evals": float(t_max),
            "row_loops_mean": float(t_max),
            "halt_depth_mean": float((p.detach() * depths).sum(1).mean()),
            "halt_entropy": float(entropy(log_p.detach()).mean()),
            "task_loss": float(task_loss.detach()),
            "kl": float(kl.detach()),
        }
        loss = task_loss + self.params.ponder_beta * kl
        return StepOutput(loss, stats, LoopProbe(h, e, batch.valid, ctx) if probe else None)
