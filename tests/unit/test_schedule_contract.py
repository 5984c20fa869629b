"""The schedule contract (looplab/schedules/base.py), checked for every registered schedule."""

import contextlib
import dataclasses
import json
import math

import pytest
import torch

from looplab.config import ModelConfig, ScheduleConfig
from looplab.errors import LooplabError
from looplab.model import LoopedTransformer
from looplab.parallel import Parallel
from looplab.params import domain_of
from looplab.schedules import SCHEDULES, DepthRule, ScheduleContext, make_schedule, register_schedule
from looplab.tasks import make_task
from tests.plugin_entries import installed, names

TASK = make_task("binary_addition")
CFG = dict(depth=3, window=1, t_max=5, lo=1, hi=6, mu=1.0, sigma=0.5, mean_depth=3.0)


def _model() -> LoopedTransformer:
    torch.manual_seed(0)
    return LoopedTransformer(ModelConfig(d_model=16, n_heads=2, core_layers=1), TASK.vocab_size).double()


def _schedule(name: str, parallel: Parallel | None = None, segment_loops: int | None = None, **extra):
    parallel = parallel or Parallel()
    if segment_loops is None:
        segment_loops = 1 if SCHEDULES[name].deep_supervision == "required" else 0
    context = ScheduleContext(TASK, 16, parallel, segment_loops=segment_loops)
    schedule = make_schedule(ScheduleConfig(name=name, **{**CFG, **extra}), context)
    if schedule.module is not None:  # seeded, random (so heads halt some rows), in double precision
        torch.manual_seed(1)
        for weight in schedule.module.parameters():
            torch.nn.init.normal_(weight, std=0.5)
        schedule.module.double()
    schedule.load_state_dict({"baseline": 0.0} if "baseline" in schedule.state_dict() else {})
    return schedule


def _batch(rows: int = 8):
    generator = torch.Generator().manual_seed(5)
    return TASK.sample_lengths(torch.randint(1, 5, (rows,), generator=generator), generator)


def _loss(schedule, model, batch, seed: int = 3):
    return schedule.training_loss(model, batch, torch.Generator().manual_seed(seed), probe=True)


NAMES = names("schedule")  # the built-in schedules and the example plugin's


@pytest.fixture(autouse=True)
def _registered(request):
    """A plugin schedule under test is registered for its test only."""
    name = request.node.callspec.params.get("name") if hasattr(request.node, "callspec") else None
    with installed("schedule", name) if name else contextlib.nullcontext():
        yield


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
def test_deep_supervision_is_declared_and_trains_deterministically_and_split_across_ranks(name):
    """A schedule that takes deep supervision (train.segment_loops) keeps the contract under it."""
    mode = SCHEDULES[name].deep_supervision
    assert mode in ("optional", "required", "refused")
    if mode == "refused":
        return
    model, batch = _model(), _batch(8)

    def segmented(parallel=None):
        return _schedule(name, parallel, segment_loops=2, t_max=6)

    first, second = _loss(segmented(), model, batch), _loss(segmented(), model, batch)
    assert torch.equal(first.loss, second.loss) and first.stats == second.stats
    assert first.stats["segments_mean"] >= 1 and torch.isfinite(first.loss)
    shards = []
    for rank in range(2):
        parallel = Parallel(rank=rank, world_size=2)
        shards.append(_loss(segmented(parallel), model, parallel.shard(batch)).loss)
    assert torch.allclose(first.loss.double(), sum(shards).double() / 2, rtol=1e-6, atol=1e-9)


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
def test_params_are_the_declared_keys_each_with_a_default_and_a_domain(name):
    """A schedule sees only the keys it declares; training and test depths above would fail on any other.
    Every key has a default, and a domain unless it is a flag."""
    cls = SCHEDULES[name]
    schedule = _schedule(name)
    assert isinstance(schedule.params, cls.Params)
    assert set(vars(schedule.params)) == set(cls.keys())
    with pytest.raises(AttributeError):
        _ = schedule.params.name
    for declared in dataclasses.fields(cls.Params):
        assert declared.default is not dataclasses.MISSING or declared.default_factory is not dataclasses.MISSING
        assert domain_of(declared) is not None or declared.type == "bool", (name, declared.name)


@pytest.mark.parametrize("name", NAMES)
def test_reports_read_label_training_depth_and_test_bound_from_the_schedule(name):
    cls = SCHEDULES[name]
    params = _schedule(name).params
    label = cls.describe(params)
    assert isinstance(label, str) and label and "{" not in label
    deepest = int(TASK.steps(torch.tensor([4]))[0])
    depth = cls.training_depth(params, deepest)
    assert isinstance(depth, int) and depth >= 1
    bound = cls.test_depth_bound(params)
    assert bound is None or (isinstance(bound, int) and bound >= 1)


def test_plain_samplers_need_no_task_or_width():
    schedule = make_schedule(ScheduleConfig(name="lognormal", mu=1.0, sigma=0.5))
    depths = schedule.train_depths(torch.ones(4, dtype=torch.long), torch.Generator().manual_seed(0))
    assert depths.shape == (4,)
    with pytest.raises(LooplabError, match="needs the task"):
        make_schedule(ScheduleConfig(name="matched")).train_depths(torch.ones(2, dtype=torch.long), None)
    with pytest.raises(LooplabError, match="model width"):
        make_schedule(ScheduleConfig(name="rl_halting"))


def test_a_schedule_missing_part_of_the_contract_is_refused_at_registration():
    class Incomplete(DepthRule):
        name = "incomplete"

        def train_depths(self, lengths, generator):
            return lengths

        def policy_depth(self, lengths):
            return lengths

    with pytest.raises(ValueError, match="'incomplete' does not implement training_depth"):
        register_schedule(Incomplete)
    assert "incomplete" not in SCHEDULES
