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

import torch
import torch.nn.functional as F
from torch import Tensor

from looplab.model.halting import (
    HazardHead,
    entropy,
    log_geometric_prior,
    log_halting_distribution,
    policy_depth,
)
from looplab.train.objectives import per_row_loss
from looplab.model.looped import LoopProbe
from looplab.train.schedules import Schedule, StepOutput, register_schedule


class LearnedHalting(Schedule):
    """Shared parts: the hazard head and the argmax-π test-time rule."""

    def __init__(self, cfg, task, d_model):
        super().__init__(cfg, task, d_model)
        self.module = HazardHead(d_model)

    def test_depths(self, lengths, hazard_logits):
        if hazard_logits is None:
            raise ValueError(f"the {self.name} schedule needs hazard logits to choose test depths")
        return policy_depth(hazard_logits)


@register_schedule
class RLHalting(LearnedHalting):
    name = "rl_halting"

    def __init__(self, cfg, task, d_model):
        super().__init__(cfg, task, d_model)
        self.baseline: float | None = None

    def state_dict(self) -> dict:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        self.baseline = state.get("baseline")

    def training_loss(self, model, batch, generator, probe=False):
        if self.cfg.entropy_mode == "exact":
            states, depth, log_pi_tau, halt_entropy, e = self._sample_exact(model, batch, generator)
        else:
            states, depth, log_pi_tau, halt_entropy, e = self._sample_on_the_fly(model, batch, generator)
        row_loss = per_row_loss(model.readout(states, model.context(batch.valid)), batch.labels)
        reward = -row_loss.detach()
        if self.cfg.entropy_mode == "sampled":
            reward = reward - self.cfg.entropy_weight * log_pi_tau.detach()
        if self.baseline is None:
            self.baseline = float(reward.mean())
        advantage = reward - self.baseline
        halt_loss = -(advantage * log_pi_tau).mean()
        if self.cfg.entropy_mode == "exact":
            halt_loss = halt_loss - self.cfg.entropy_weight * halt_entropy.mean()
        m = self.cfg.baseline_momentum
        self.baseline = m * self.baseline + (1 - m) * float(reward.mean())
        stats = {
            "block_evals": float(self.cfg.t_max if self.cfg.entropy_mode == "exact" else depth.max()),
            "row_loops_mean": float(self.cfg.t_max if self.cfg.entropy_mode == "exact" else depth.float().mean()),
            "halt_depth_mean": float(depth.float().mean()),
            "halt_entropy": float(halt_entropy.detach().mean()),
            "halt_loss": float(halt_loss.detach()),
            "baseline": self.baseline,
            "task_loss": float(row_loss.detach().mean()),
        }
        return StepOutput(row_loss.mean() + halt_loss, stats, LoopProbe(states, e, batch.valid) if probe else None)

    def _sample_exact(self, model, batch, generator):
        """Unroll every row to T_max; draw τ from the exact π.

        Returns:
            states at τ [B, L, d], τ [B], log π(τ) [B], H(π) [B], the injected input e [B, L, d].
        """
        t_max = self.cfg.t_max
        h, e, ctx = model.start(batch.tokens, batch.valid, generator)
        states, logits = [], []
        for _ in range(t_max):
            h = model.step(h, e, ctx)
            states.append(h)
            logits.append(self.module(h.detach(), batch.valid))
        log_pi = log_halting_distribution(torch.stack(logits, dim=1))
        depth = torch.multinomial(log_pi.detach().exp().cpu(), 1, generator=generator).squeeze(1).to(h.device) + 1
        rows = torch.arange(len(depth), device=h.device)
        chosen = torch.stack(states)[depth - 1, rows]
        return chosen, depth, log_pi[rows, depth - 1], entropy(log_pi), e

    def _sample_on_the_fly(self, model, batch, generator):
        """Stop each running row at loop t with probability r_t; stopped rows leave the batch.

        Returns:
            states at τ [B, L, d], τ [B], log π(τ) [B], −log π(τ) [B] (the one-sample
            entropy estimate, for logging), and the injected input e [B, L, d].
        """
        t_max = self.cfg.t_max
        h, e_rows, ctx = model.start(batch.tokens, batch.valid, generator)
        e = e_rows
        batch_size = len(batch.tokens)
        alive = torch.arange(batch_size, device=h.device)
        survived = h.new_zeros(batch_size)  # Σ_{i<t} log(1 − r_i) of the running rows
        finished_states, finished_rows, finished_log_pi, finished_depth = [], [], [], []
        for t in range(1, t_max + 1):
            h = model.step(h, e, ctx)
            if t < t_max:
                hazard_logit = self.module(h.detach(), batch.valid[alive])
                draw = torch.rand(len(alive), generator=generator).to(h.device)
                stop = draw < torch.sigmoid(hazard_logit.detach())
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
        return states, depth, log_pi_tau, -log_pi_tau, e_rows


@register_schedule
class PonderNet(LearnedHalting):
    name = "pondernet"

    def training_loss(self, model, batch, generator, probe=False):
        t_max = self.cfg.t_max
        h, e, ctx = model.start(batch.tokens, batch.valid, generator)
        logits, losses = [], []
        for _ in range(t_max):
            h = model.step(h, e, ctx)
            logits.append(self.module(h, batch.valid))
            losses.append(per_row_loss(model.readout(h, ctx), batch.labels))
        log_p = log_halting_distribution(torch.stack(logits, dim=1))
        p = log_p.exp()
        task_loss = (p * torch.stack(losses, dim=1)).sum(1).mean()
        prior = log_geometric_prior(self.cfg.ponder_prior, t_max, device=h.device)
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
        loss = task_loss + self.cfg.ponder_beta * kl
        return StepOutput(loss, stats, LoopProbe(h, e, batch.valid) if probe else None)
