"""Learning checks: small models must actually learn (run by CI under the ``slow`` marker)."""

from __future__ import annotations

import pytest

from looplab.config import load_config
from looplab.eval.grid import evaluate_lengths
from looplab.eval.metrics import summarize
from looplab.train.trainer import train

pytestmark = pytest.mark.slow


def _train_and_score(tmp_path, overrides: list[str]) -> dict:
    config = load_config(None, overrides)
    exp = train(config, tmp_path / "run", progress=False)
    outcomes = evaluate_lengths(
        exp.model, exp.task, exp.schedule, config.task.eval_lengths, config.eval.max_loops, 256, 256, config.run.seed
    )
    return summarize(outcomes, config.task.train_max)


def test_binary_addition_matched_learns_in_distribution(tmp_path):
    summary = _train_and_score(
        tmp_path,
        [
            "task.name=binary_addition",
            "task.train_max=8",
            "task.eval_lengths=[3,5,8,12]",
            "schedule.name=matched",
            "train.steps=500",
            "train.lr=1e-3",
            "eval.max_loops=16",
        ],
    )
    assert summary["policy_id"] >= 0.95, summary
    assert summary["oracle_id"] >= 0.95, summary


def test_parity_window_learns_in_distribution(tmp_path):
    summary = _train_and_score(
        tmp_path,
        [
            "task.name=parity",
            "task.train_max=8",
            "task.eval_lengths=[3,5,8]",
            "schedule.name=window",
            "schedule.window=2",
            "schedule.t_max=10",
            "train.steps=600",
            "train.lr=1e-3",
            "eval.max_loops=12",
        ],
    )
    assert summary["oracle_id"] >= 0.95, summary


def test_rl_halting_learns_in_distribution(tmp_path):
    summary = _train_and_score(
        tmp_path,
        [
            "task.name=binary_addition",
            "task.train_max=8",
            "task.eval_lengths=[3,5,8]",
            "schedule.name=rl_halting",
            "schedule.t_max=12",
            "train.steps=500",
            "eval.max_loops=16",
        ],
    )
    assert summary["policy_id"] >= 0.9, summary
    assert summary["halting"], "an RL-Halting run reports its halting distribution"


def test_act_bce_learns_and_halts_before_t_max_where_the_answer_is_already_right(tmp_path):
    """TRM's halting head under deep supervision: the model learns, and with halting applied per row the
    short additions leave early at no cost in accuracy."""
    from looplab.eval.grid import draw_eval_batches
    from looplab.eval.halting_inference import halting_frame

    config = load_config(
        None,
        [
            "task.name=binary_addition",
            "task.train_max=8",
            "task.eval_lengths=[2,5,8]",
            "schedule.name=act_bce",
            "schedule.t_max=12",
            "train.segment_loops=2",
            "train.steps=500",
            "eval.max_loops=16",
        ],
    )
    exp = train(config, tmp_path / "run", progress=False)
    drawn = draw_eval_batches(exp.task, [2, 5, 8], 256, 256, config.run.seed)
    frame = halting_frame(exp.model, exp.schedule, drawn, 16)
    assert (frame.on_accuracy >= 0.9).all(), frame
    assert (frame.on_accuracy >= frame.off_accuracy - 0.02).all(), frame
    shortest, longest = frame.on_depth_mean.iloc[0], frame.on_depth_mean.iloc[-1]
    assert shortest < 12 and shortest <= longest, frame


def test_jsrr_lowers_the_spectral_radius(tmp_path):
    from looplab.seeding import derive_generator
    from looplab.stability.spectral import spectral_trajectory

    radius = {}
    for estimator in ("none", "jvp"):
        config = load_config(
            None,
            [
                "task.name=decimal_addition",
                "task.train_min=4",
                "task.train_max=4",
                "task.eval_lengths=[4]",
                "model.injection=none",
                "model.d_model=32",
                "model.n_heads=2",
                "schedule.name=fixed",
                "schedule.depth=4",
                "train.steps=300",
                f"stability.jsrr.estimator={estimator}",
            ],
        )
        exp = train(config, tmp_path / estimator, progress=False)
        batch = exp.task.sample(4, 8, derive_generator(0, "spectral-test"))
        frame = spectral_trajectory(exp.model, batch, 4, 40, (), derive_generator(0, "power"))
        radius[estimator] = frame["rho_power"].mean()
    assert radius["jvp"] < 0.9 * radius["none"], radius


@pytest.mark.parametrize("positional", ["rope", "nope"])
def test_causal_binary_addition_learns_every_training_length(tmp_path, positional):
    """With the start token a causal model can tell the first positions of 11 11 ... apart (≥ 99 %)."""
    summary = _train_and_score(
        tmp_path,
        [
            "task.name=binary_addition",
            "task.train_max=6",
            "task.eval_lengths=[2,4,6]",
            "model.causal=true",
            f"model.positional={positional}",
            "schedule.name=matched",
            "train.steps=400",
            "eval.max_loops=10",
        ],
    )
    assert summary["oracle_id"] >= 0.99, summary
