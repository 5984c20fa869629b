"""The schedule contract (looplab/schedules/base.py), checked for every registered schedule."""

import json
import math

import pytest
import torch

from looplab.config import ModelConfig, ScheduleConfig
from looplab.errors import LooplabError
from looplab.model import LoopedTransformer
from looplab.parallel import Parallel
from looplab.schedules import SCHEDULES, DepthRule, ScheduleContext, make_schedule
from looplab.tasks import make_task

TASK = make_task("binary_addition")
CFG = dict(depth=3, window=1, t_max=5, lo=1, hi=6, mu=1.0, sigma=0.5, mean_depth=3.0)


def _model() -> LoopedTransformer:
    torch.manual_seed(0)
    return LoopedTransformer(ModelConfig(d_model=16, n_heads=2, core_layers=1), TASK.vocab_size).double()


def _schedule(name: str, parallel: Parallel | None = None, **extra):
    parallel = parallel or Parallel()
    schedule = make_schedule(ScheduleConfig(name=name, **CFG, **extra), ScheduleContext(TASK, 16, parallel))
    if schedule.module is not None:
        torch.manual_seed(1)
        schedule.module = type(schedule.module)(16).double()
    schedule.load_state_dict({"baseline": 0.0} if "baseline" in schedule.state_dict() else {})
    return schedule


def _batch(rows: int = 8):
    generator = torch.Generator().manual_seed(5)
    return TASK.sample_lengths(torch.randint(1, 5, (rows,), generator=generator), generator)


def _loss(schedule, model, batch, seed: int = 3):
    return schedule.training_loss(model, batch, torch.Generator().manual_seed(seed), probe=True)


NAMES = sorted(SCHEDULES)


def test_every_builtin_schedule_is_registered():
    assert {
        "fixed",
        "matched",
        "window",
        "fixed_window",
        "multi_depth",
        "lognormal",
        "poisson_lognormal",
        "rl_halting",
        "pondernet",
    } <= set(SCHEDULES)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_given_the_generator(name):
    model, batch = _model(), _batch()
    first, second = _loss(_schedule(name), model, batch), _loss(_schedule(name), model, batch)
    assert torch.equal(first.loss, second.loss)
    assert first.stats == second.stats
    assert torch.equal(first.probe.h, second.probe.h)


@pytest.mark.parametrize("name", NAMES)
def test_two_rank_split_trains_the_rows_single_process_training_does(name):
    """The mean of two ranks' shard losses is the global batch's loss."""
    model, batch = _model(), _batch(8)
    whole = _loss(_schedule(name), model, batch).loss
    shards = []
    for rank in range(2):
        parallel = Parallel(rank=rank, world_size=2)
        shards.append(_loss(_schedule(name, parallel), model, parallel.shard(batch)).loss)
    # the cross-entropy is taken in float32 (per_row_loss), hence the tolerance
    assert torch.allclose(whole.double(), sum(shards).double() / 2, rtol=1e-6, atol=1e-9), (whole, shards)


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trips_through_json(name):
    model, batch = _model(), _batch()
    trained = _schedule(name)
    _loss(trained, model, batch)
    restored = _schedule(name)
    restored.load_state_dict(json.loads(json.dumps(trained.state_dict())))
    assert restored.state_dict() == trained.state_dict()
    assert torch.equal(_loss(restored, model, batch, seed=9).loss, _loss(trained, model, batch, seed=9).loss)


@pytest.mark.parametrize("name", NAMES)
def test_stats_and_test_depths(name):
    model, batch = _model(), _batch()
    schedule = _schedule(name)
    out = _loss(schedule, model, batch)
    assert {"block_evals", "row_loops_mean"} <= set(out.stats)
    assert all(math.isfinite(v) for v in out.stats.values())
    assert out.probe.h.shape == (*batch.tokens.shape, 16)
    h, e, ctx = model.start(batch.tokens, batch.valid)
    hazards = []
    for _ in range(6):
        h = model.step(h, e, ctx)
        hazards.append(schedule.hazard_logit(h, batch.valid))
    learned = schedule.module is not None
    assert (hazards[0] is not None) == learned and learned != isinstance(schedule, DepthRule)
    depths = schedule.test_depths(batch.lengths, torch.stack(hazards, dim=1) if learned else None)
    assert depths.shape == batch.lengths.shape and depths.dtype == torch.long and int(depths.min()) >= 1


@pytest.mark.parametrize("name", NAMES)
def test_params_name_every_key_the_schedule_reads(name):
    """A schedule sees only the keys it lists; training and test depths above would fail on any other."""
    schedule = _schedule(name)
    assert set(vars(schedule.cfg)) == set(SCHEDULES[name].params)
    with pytest.raises(AttributeError):
        _ = schedule.cfg.name


def test_plain_samplers_need_no_task_or_width():
    schedule = make_schedule(ScheduleConfig(name="lognormal", mu=1.0, sigma=0.5))
    depths = schedule.train_depths(torch.ones(4, dtype=torch.long), torch.Generator().manual_seed(0))
    assert depths.shape == (4,)
    with pytest.raises(LooplabError, match="needs the task"):
        make_schedule(ScheduleConfig(name="matched")).train_depths(torch.ones(2, dtype=torch.long), None)
    with pytest.raises(LooplabError, match="model width"):
        make_schedule(ScheduleConfig(name="rl_halting"))
