"""Halting distributions, RL-Halting and PonderNet objectives, and the test-time exits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from looplab.config import ModelConfig, ScheduleConfig
from looplab.eval.exits import halting_summary
from looplab.eval.grid import LengthOutcome
from looplab.exits import exit_depths, exit_params
from looplab.model import LoopedTransformer
from looplab.model.attention import AttentionContext
from looplab.model.halting import (
    HazardHead,
    entropy,
    log_geometric_prior,
    log_halting_distribution,
    masked_mean_pool,
    policy_depth,
)
from looplab.schedules import PonderNet, RLHalting, ScheduleContext
from looplab.tasks import make_task

TASK = make_task("parity")


def brute_force_pi(hazards: list[float]) -> list[float]:
    """π(t) = r_t ∏_{i<t}(1 − r_i) for t < T; the rest of the mass at T."""
    pi, survive = [], 1.0
    for r in hazards[:-1]:
        pi.append(r * survive)
        survive *= 1 - r
    return pi + [survive]


def test_pi_matches_brute_force_and_sums_to_one():
    logits = torch.randn(5, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    log_pi = log_halting_distribution(logits)
    assert torch.allclose(log_pi.exp().sum(1), torch.ones(5, dtype=torch.float64))
    for row in range(5):
        expected = brute_force_pi(torch.sigmoid(logits[row]).tolist())
        assert np.allclose(log_pi[row].exp().numpy(), expected, atol=1e-12)


def test_argmax_counts_the_remainder_mass():
    # hazards of 0.1 everywhere: π(1) = 0.1 is the largest single step for T = 3,
    # but with T = 3 the remainder 0.81 at t = 3 dominates.
    logits = torch.full((1, 3), math.log(0.1 / 0.9))
    assert policy_depth(logits).item() == 3
    # a large hazard at step 2 makes 2 the mode
    logits[0, 1] = 5.0
    assert policy_depth(logits).item() == 2


def test_geometric_prior_and_entropy():
    prior = log_geometric_prior(0.2, 6).exp()
    expected = [0.2 * 0.8 ** (t - 1) for t in range(1, 6)] + [0.8**5]
    assert np.allclose(prior.numpy(), expected, atol=1e-6)
    uniform = torch.full((1, 4), math.log(0.25))
    assert entropy(uniform).item() == pytest.approx(math.log(4))


def test_mean_pool_ignores_padding():
    h = torch.randn(2, 4, 3)
    valid = torch.tensor([[True, True, False, False], [True, True, True, True]])
    pooled = masked_mean_pool(h, valid)
    assert torch.allclose(pooled[0], h[0, :2].mean(0))
    assert torch.allclose(pooled[1], h[1].mean(0))


def _model_and_batch(seed=0, d=16):
    torch.manual_seed(seed)
    model = LoopedTransformer(ModelConfig(d_model=d, n_heads=2, core_layers=1), TASK.vocab_size).double()
    batch = TASK.sample_lengths(torch.tensor([3, 5, 7, 4, 6, 2]), torch.Generator().manual_seed(seed))
    return model, batch


def _rl(**kwargs) -> RLHalting:
    schedule = RLHalting(ScheduleConfig(name="rl_halting", t_max=6, **kwargs), ScheduleContext(TASK, 16))
    schedule.module.double()
    return schedule


@pytest.mark.parametrize("mode", ["sampled", "exact"])
def test_sample_returns_log_pi_of_the_sampled_depth(mode):
    """The public sample's log π(τ) is the τ-th entry of the distribution a full unroll gives."""
    model, batch = _model_and_batch()
    schedule = _rl(entropy_mode=mode)
    drawn = schedule.sample(model, batch, torch.Generator().manual_seed(4))
    full = schedule.distribution(model, batch)
    rows = torch.arange(len(drawn.depth))
    assert drawn.depth.min() >= 1 and drawn.depth.max() <= 6
    assert torch.allclose(drawn.log_prob, full[rows, drawn.depth - 1], atol=1e-10)
    assert torch.allclose(full.exp().sum(1), torch.ones(len(rows), dtype=full.dtype))
    if mode == "exact":
        assert torch.allclose(drawn.log_pi, full, atol=1e-10)
        assert torch.allclose(drawn.entropy, entropy(full), atol=1e-10)
    else:
        assert drawn.log_pi is None
        assert torch.equal(drawn.entropy, -drawn.log_prob)


def test_on_the_fly_sampling_follows_pi():
    """With a constant hazard r the sampled depths follow π exactly (a truncated geometric)."""
    model, batch = _model_and_batch()
    schedule = _rl(entropy_mode="sampled")
    torch.nn.init.zeros_(schedule.module.linear.weight)
    torch.nn.init.constant_(schedule.module.linear.bias, math.log(0.3 / 0.7))
    generator = torch.Generator().manual_seed(1)
    counts = np.zeros(6)
    with torch.no_grad():
        for _ in range(400):
            depth = schedule.sample(model, batch, generator).depth
            np.add.at(counts, depth.numpy() - 1, 1)
    expected = np.array(brute_force_pi([0.3] * 6))
    assert np.abs(counts / counts.sum() - expected).max() < 0.02


@pytest.mark.parametrize("mode", ["sampled", "exact"])
def test_halting_loss_leaves_model_gradients_unchanged(mode):
    grads = []
    for weight, baseline in ((0.0, None), (5.0, 3.0)):
        model, batch = _model_and_batch()
        schedule = _rl(entropy_mode=mode, entropy_weight=weight)
        schedule.baseline = baseline
        schedule.training_loss(model, batch, torch.Generator().manual_seed(2)).loss.backward()
        grads.append(
            ([p.grad.clone() for p in model.parameters()], [p.grad.clone() for p in schedule.module.parameters()])
        )
    (model_a, head_a), (model_b, head_b) = grads
    assert all(torch.equal(a, b) for a, b in zip(model_a, model_b))
    assert not all(torch.equal(a, b) for a, b in zip(head_a, head_b))


def test_exact_and_sampled_modes_agree_on_the_law_of_tau():
    model, batch = _model_and_batch()
    means = {}
    for mode in ("exact", "sampled"):
        schedule = _rl(entropy_mode=mode)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            depths = torch.cat([schedule.sample(model, batch, generator).depth for _ in range(300)])
        means[mode] = depths.double().mean().item()
    assert means["exact"] == pytest.approx(means["sampled"], abs=0.15)


class DepthToy(torch.nn.Module):
    """A stand-in model whose state counts loops; the readout is right only from ``good_from`` loops on.

    Channel 0 of the state holds t, so the hazard head can learn depth-dependent hazards.
    """

    def __init__(self, vocab: int, good_from: int, margin_decay: float = 0.0):
        super().__init__()
        self.vocab, self.good_from, self.margin_decay = vocab, good_from, margin_decay
        self.labels = None

    def context(self, valid):
        return AttentionContext.build(valid, causal=False, rope=None, use_math=False)

    def start(self, tokens, valid, generator=None):
        h = torch.zeros(*tokens.shape, 4)
        return h, h, self.context(valid)

    def step(self, h, e, ctx):
        return h + torch.tensor([1.0, 0, 0, 0])

    def readout(self, h, ctx):
        depth = h[..., 0]
        margin = torch.where(depth >= self.good_from, 4.0 - self.margin_decay * depth, -4.0)
        target = torch.nn.functional.one_hot(self.labels.clamp_min(0), self.vocab).float()
        return margin.unsqueeze(-1) * target


def _train_head(toy: DepthToy, schedule: RLHalting, steps: int) -> tuple[float, float]:
    """Train only the hazard head on the toy; return (mean depth, entropy) of π at the end."""
    optimizer = torch.optim.Adam(schedule.module.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = TASK.sample(5, 32, generator)
        toy.labels = batch.labels
        loss = schedule.training_loss(toy, batch, generator).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    batch = TASK.sample(5, 64, generator)
    with torch.no_grad():
        h = toy.start(batch.tokens, batch.valid)[0]
        logits = []
        for _ in range(schedule.params.t_max):
            h = toy.step(h, None, None)
            logits.append(schedule.module(h, batch.valid))
        log_pi = log_halting_distribution(torch.stack(logits, dim=1))
    depths = torch.arange(1, schedule.params.t_max + 1, dtype=log_pi.dtype)
    return float((log_pi.exp() * depths).sum(1).mean()), float(entropy(log_pi).mean())


@pytest.mark.parametrize("mode", ["sampled", "exact"])
def test_reinforce_learns_to_loop_deeper_when_answers_need_it(mode):
    schedule = RLHalting(ScheduleConfig(name="rl_halting", t_max=10, entropy_mode=mode), ScheduleContext(TASK, 4))
    torch.nn.init.constant_(schedule.module.linear.bias, 1.0)  # start shallow: r ≈ 0.73
    start_depth, _ = _train_head(DepthToy(TASK.vocab_size, good_from=5), schedule, 0)
    end_depth, _ = _train_head(DepthToy(TASK.vocab_size, good_from=5), schedule, 150)
    assert start_depth < 2.0 and end_depth > 5.0


def test_without_entropy_bonus_the_policy_concentrates():
    schedule = RLHalting(ScheduleConfig(name="rl_halting", t_max=8, entropy_weight=0.0), ScheduleContext(TASK, 4))
    torch.nn.init.constant_(schedule.module.linear.bias, -1.0)
    toy = DepthToy(TASK.vocab_size, good_from=1, margin_decay=0.45)  # every depth right, shallow ones surer
    _, start_entropy = _train_head(toy, schedule, 0)
    end_depth, end_entropy = _train_head(toy, schedule, 150)
    assert end_entropy < 0.5 * start_entropy and end_depth < 2.0


def test_pondernet_loss_trains_head_and_model_together():
    model, batch = _model_and_batch()
    schedule = PonderNet(ScheduleConfig(name="pondernet", t_max=5), ScheduleContext(TASK, 16))
    schedule.module.double()
    out = schedule.training_loss(model, batch, torch.Generator().manual_seed(0))
    out.loss.backward()
    stats = out.stats
    assert stats["block_evals"] == 5 and 1 <= stats["halt_depth_mean"] <= 5
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in schedule.module.parameters())
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


def test_exits_pick_the_expected_depths():
    correct = np.array([[False, True, True, False], [True, True, True, True]])
    outcome = LengthOutcome(
        length=3,
        correct=correct,
        flips=np.zeros((2, 3), dtype=bool),
        policy_depth=np.array([2, 4]),
        confidence=np.array([[-3.0, -0.1, -0.5, -2.0], [-0.2, -0.3, -0.4, -0.5]]),
        state_norm=np.array([[1.0, 1.0, 2.0, 1.0], [np.inf, np.nan, np.nan, np.nan]]),
        step_norm=np.array([[0.5, 0.1, 2e-4, 1e-5], [np.inf, np.nan, np.nan, np.nan]]),
        hazard_logits=np.array([[-5.0, 5.0, -5.0, 0.0], [-5.0, -5.0, -5.0, 0.0]]),
    )
    depths = exit_depths(outcome, exit_params({"fixed": {"depth": 9}, "convergence": {"eps": 1e-3}}))
    assert depths["policy"].tolist() == [2, 4]
    assert depths["fixed"].tolist() == [4, 4]  # clipped to T
    assert depths["confidence"].tolist() == [2, 1]
    assert depths["convergence"].tolist() == [3, 4]  # a diverged row never converges
    assert depths["argmax_pi"].tolist() == [2, 4]
    halting = halting_summary(outcome)
    assert len(halting["histogram"]) == 4 and sum(halting["histogram"]) == pytest.approx(1.0)
    assert 1 <= halting["mean_depth"] <= 4


def test_hazard_head_starts_with_small_hazards():
    head = HazardHead(8)
    hazard = torch.sigmoid(head(torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.bool)))
    assert (hazard < 0.2).all()
