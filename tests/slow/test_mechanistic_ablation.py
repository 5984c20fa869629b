"""The paper's norm × injection ablation on randomly initialised 12-layer looped cores (untrained, 128 loops).

Uses the shipped ablation presets (the setting the paper measured: no training, no
prelude or coda): with random-gain concat injection a pre-norm core's layers settle on
distinct fixed points (cross-layer cosine well below 1) and each sits on its own (self
cosine ≈ 1); without injection the layers collapse onto one state (cross-layer cosine ≈ 1).
"""

from __future__ import annotations

import pytest
import torch

from looplab.analysis.fixed_points import fixed_point_cross_cos_min, late_self_cos, self_convergence
from looplab.cli import PRESETS
from looplab.config import load_config
from looplab.experiment import Experiment
from looplab.model.trace import trace
from looplab.seeding import derive_generator

pytestmark = pytest.mark.slow
SEEDS = (0, 1, 2, 3, 4)


def fixed_points(preset: str, seed: int, samples: int = 4, loops: int = 128) -> tuple[float, float]:
    """(median per-sample self cosine, min cross-layer cosine) of the first core layer."""
    config = load_config(PRESETS / "mechanistic" / f"{preset}.toml", [f"run.seed={seed}"])
    exp = Experiment.build(config)
    length = config.task.train_max
    batch = exp.task.sample(length, samples, derive_generator(seed, "mechanistic", length))
    states = trace(exp.model.eval(), batch.tokens, batch.valid, loops).states()
    _, self_median = late_self_cos(self_convergence(states, batch.valid, per_sample=True)[0])
    return self_median, fixed_point_cross_cos_min(states, batch.valid)


@pytest.fixture(scope="module")
def with_injection() -> list[tuple[float, float]]:
    return [fixed_points("ablation-pre-injection", seed) for seed in SEEDS]


def test_pre_norm_with_injection_has_distinct_fixed_points(with_injection):
    """Every seed's layers settle on distinct fixed points; the first layer sits on its own in all
    seeds but at most one (seed 1 of 0..4 oscillates slowly: median self cosine 0.95–0.96)."""
    assert all(cross < 0.8 for _, cross in with_injection), with_injection
    assert sum(self_cos > 0.99 for self_cos, _ in with_injection) >= len(SEEDS) - 1, with_injection


@pytest.mark.parametrize("seed", SEEDS)
def test_pre_norm_without_injection_collapses_to_one_state(seed):
    _, cross = fixed_points("ablation-pre-none", seed)
    assert cross > 0.99


def test_the_seed_decides_the_outcome_deterministically():
    first = fixed_points("ablation-pre-injection", 0, loops=16)
    torch.rand(7)  # the global generator's state does not matter: the run's seed decides the weights
    assert fixed_points("ablation-pre-injection", 0, loops=16) == first
    assert fixed_points("ablation-pre-injection", 1, loops=16) != first
