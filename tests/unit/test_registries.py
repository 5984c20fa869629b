"""The extension registries: regularisers, test-time exits, mechanistic metrics, and the model's layer hook."""

import json

import numpy as np
import pytest
import torch
from torch.func import jvp

from looplab import exits, regularisers
from looplab.analysis import registry as metric_registry
from looplab.analysis.mechanistic import analyze_experiment
from looplab.analysis.registry import MetricResult, register_metric
from looplab.config import ModelConfig, load_config
from looplab.errors import LooplabError
from looplab.eval.grid import LengthOutcome
from looplab.eval.metrics import summarize
from looplab.exits import exit_depths, exit_params, register_exit
from looplab.experiment import Experiment, check_config
from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopProbe
from looplab.model.trace import trace
from looplab.parallel import SINGLE
from looplab.regularisers import JacobianPenalty, Regulariser, build_regularisers, regularised_loss
from looplab.stability.jacobian import jsrr_per_sample, loop_map, random_direction
from looplab.tasks import make_task
from looplab.train.trainer import make_optimizer, train_step

TINY = [
    "model.d_model=16",
    "model.n_heads=2",
    "model.core_layers=1",
    "task.train_max=4",
    "train.batch_size=8",
    "schedule.name=fixed",
    "schedule.depth=3",
    "train.steps=10",
]


# ---------------------------------------------------------------- regularisers


class StateEnergy(Regulariser):
    """Mean square of the probe state (a test entry)."""

    name = "state_energy"

    def penalty(self, model, probe, generator):
        return probe.h.pow(2).mean(dim=(1, 2))


@pytest.fixture
def state_energy(monkeypatch):
    monkeypatch.setitem(regularisers.REGULARISERS, StateEnergy.name, StateEnergy)


ENERGY = ["stability.state_energy.weight=0.25", "stability.state_energy.warmup=2", "stability.state_energy.prob=0.5"]


def test_jsrr_is_built_from_its_config_section_and_off_by_default():
    assert build_regularisers(load_config(None, TINY)) == []
    (jsrr,) = build_regularisers(
        load_config(
            None, TINY + ["stability.jsrr.estimator=vjp", "stability.jsrr.weight=0.3", "stability.jsrr.warmup=4"]
        )
    )
    assert isinstance(jsrr, JacobianPenalty)
    assert (jsrr.params.estimator, jsrr.weight, jsrr.warmup) == ("vjp", 0.3, 4)


def test_a_registered_regulariser_is_off_until_its_section_turns_it_on(state_energy):
    config = load_config(None, TINY)
    check_config(config)
    assert config.stability["state_energy"] == {"weight": 0.0, "warmup": 0, "prob": 1.0}  # shown, with defaults
    assert build_regularisers(config) == []
    (found,) = build_regularisers(load_config(None, TINY + ENERGY))
    assert isinstance(found, StateEnergy) and (found.weight, found.warmup, found.prob) == (0.25, 2, 0.5)


@pytest.mark.parametrize(
    "override, message",
    [
        ("stability.state_energy.weight=1.5", r"stability\.state_energy\.weight must be in \[0, 1\], got 1.5"),
        ("stability.state_energy.gain=2", r"unknown key in \[stability\.state_energy\] 'gain'; valid choices: prob"),
        ("stability.energy.weight=0.1", r"unknown regulariser .* 'energy'; valid choices: jsrr, state_energy"),
        ("stability.jsrr.estimator=exact", r"unknown value for stability\.jsrr\.estimator: 'exact'"),
    ],
)
def test_regulariser_sections_are_checked_against_their_declaration(state_energy, override, message):
    with pytest.raises(LooplabError, match=message):
        check_config(load_config(None, [*TINY, override]))


def test_warmup_and_probability_are_applied_generically(state_energy):
    (reg,) = build_regularisers(load_config(None, TINY + ENERGY))
    applied = [reg.generator_for(step, 0, SINGLE) is not None for step in range(1, 401)]
    assert not any(applied[:2])
    assert 0.4 < np.mean(applied[2:]) < 0.6
    assert applied == [reg.generator_for(step, 0, SINGLE) is not None for step in range(1, 401)]


def test_loss_mixes_task_loss_and_penalties_by_weight():
    probe = LoopProbe(torch.full((2, 3, 4), 2.0), torch.zeros(2, 3, 4), torch.ones(2, 3, dtype=torch.bool))
    reg = StateEnergy(weight=0.25)
    loss, stats = regularised_loss(torch.tensor(1.0), {"a": 1.0}, None, probe, [(reg, None)])
    assert float(loss) == pytest.approx(0.75 * 1.0 + 0.25 * 4.0)
    assert stats == {"a": 1.0, "state_energy": 4.0}
    assert regularised_loss(torch.tensor(1.0), {}, None, None, []) == (torch.tensor(1.0), {})


def test_a_registered_regulariser_trains_and_is_logged(state_energy):
    exp = Experiment.build(load_config(None, TINY + ENERGY))
    assert [type(r) for r in exp.regularisers] == [StateEnergy]
    optimizer = make_optimizer(exp)
    logged = [train_step(exp, optimizer, step) for step in range(1, 9)]
    assert all("state_energy" not in m for m in logged[:2])
    assert any("state_energy" in m for m in logged[2:])


def test_jsrr_per_sample_uses_the_given_direction():
    torch.manual_seed(0)
    task = make_task("copy")
    model = LoopedTransformer(
        ModelConfig(d_model=8, n_heads=2, core_layers=1, attention="math"), task.vocab_size
    ).double()
    batch = task.sample(3, 4, torch.Generator().manual_seed(1))
    h, e, ctx = model.start(batch.tokens, batch.valid)
    probe = LoopProbe(model.step(h, e, ctx).detach(), e.detach(), batch.valid)
    v = random_direction(batch.valid, 8, torch.Generator().manual_seed(2), dtype=torch.float64)
    values = jsrr_per_sample(model, probe, "jvp", 0, direction=v)
    phi = loop_map(model, probe.e, probe.valid)
    expected = jvp(phi, (probe.h,), (v,))[1].mul(batch.valid.unsqueeze(-1)).flatten(1).pow(2).sum(1)
    assert values.shape == (4,)
    assert torch.allclose(values, expected)
    other = jsrr_per_sample(
        model,
        probe,
        "jvp",
        0,
        direction=random_direction(batch.valid, 8, torch.Generator().manual_seed(3), dtype=torch.float64),
    )
    assert not torch.allclose(values, other)


# ---------------------------------------------------------------- exits


def _outcome(count=6, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    return LengthOutcome(
        length=4,
        correct=rng.random((count, steps)) < 0.5,
        flips=rng.random((count, steps - 1)) < 0.3,
        policy_depth=rng.integers(1, steps + 1, count),
        confidence=rng.normal(size=(count, steps)),
        state_norm=np.ones((count, steps)),
        step_norm=rng.random((count, steps)) * 1e-2,
        hazard_logits=rng.normal(size=(count, steps)).astype(np.float32),
    )


@pytest.mark.parametrize("name", sorted(exits.EXITS))
def test_every_exit_returns_depths_in_range(name):
    outcome = _outcome()
    depths = exits.EXITS[name](outcome, exit_params({"fixed": {"depth": 3}, "convergence": {"eps": 5e-3}})[name])
    assert depths.shape == (6,) and depths.min() >= 1 and depths.max() <= 5
    bare = LengthOutcome(4, outcome.correct, outcome.flips, outcome.policy_depth)
    assert name in exit_depths(bare) or exits.EXITS[name](bare, exit_params({})[name]) is None


def test_a_registered_exit_is_summarised(monkeypatch):
    monkeypatch.setitem(
        exits.EXITS, "last", lambda outcome, settings: np.full(len(outcome.correct), outcome.correct.shape[1])
    )
    outcome = _outcome()
    summary = summarize([outcome], train_max=8)
    assert list(summary["exits"])[-1] == "last"
    assert summary["exits"]["last"]["policy_id"] == pytest.approx(outcome.correct[:, -1].mean())
    assert register_exit("x")(len) is len and exits.EXITS.pop("x") is len


# ---------------------------------------------------------------- metrics and the trace hook


@pytest.fixture
def tiny_experiment():
    exp = Experiment.build(load_config(None, TINY))
    exp.model.eval()
    return exp


def test_a_registered_metric_writes_its_entries_tables_and_plots(tiny_experiment, tmp_path, monkeypatch):
    def final_norm(inputs):
        value = float(inputs.loop_states[-1].norm())
        return MetricResult(
            {"final_norm": value},
            {"final.csv": (["norm"], [(value,)])},
            {"final.txt": lambda path: path.write_text(f"{value}")},
        )

    monkeypatch.setitem(metric_registry.METRICS, "final_norm", final_norm)
    assert register_metric("final_norm")(final_norm) is final_norm
    summary = analyze_experiment(tiny_experiment, tmp_path, loops=4, samples=2, mlp_ablation=False)
    assert list(summary)[-1] == "final_norm"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "final.csv").read_text().splitlines()[0] == "norm"
    assert float((tmp_path / "final.txt").read_text()) == summary["final_norm"]
    assert not list(tmp_path.glob(".tmp_*"))


def test_builtin_metrics_keep_their_summary_order(tiny_experiment, tmp_path):
    summary = analyze_experiment(tiny_experiment, tmp_path, loops=3, samples=2, mlp_ablation=False)
    assert list(metric_registry.METRICS)[:6] == [
        "fixed_points",
        "convergence",
        "attention",
        "colsum",
        "token_dynamics",
        "massive",
    ]
    assert list(summary)[5:8] == ["fixed_point_self_cos", "fixed_point_self_cos_median", "fixed_point_cross_cos_min"]
    assert list(summary)[-2:] == ["massive_ratio_max", "massive_ratio_last_loop"]


def test_trace_observes_the_model_rather_than_recomputing_it(tiny_experiment):
    """A model whose step differs from the textbook loop (here: the core applied twice) is traced as it runs."""
    model = tiny_experiment.model
    plain_step = model.step
    model.step = lambda h, e, ctx: plain_step(plain_step(h, e, ctx), e, ctx)
    batch = tiny_experiment.task.sample(4, 2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        unrolled = torch.stack([h for h, _ in model.unroll(batch.tokens, batch.valid, 3)])
    recorded = trace(model, batch.tokens, batch.valid, 3)
    assert torch.equal(recorded.loop_states(), unrolled)
    assert recorded.layers == [0] and len([n for n in recorded.names() if n.endswith("core0.resid")]) == 3


def test_layer_hook_sees_every_layer_once_per_call(tiny_experiment):
    calls = []

    def hook(site, index, layer, x, run):
        calls.append((site, index))
        return run(x)

    model = tiny_experiment.model
    batch = tiny_experiment.task.sample(3, 2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(batch.tokens, batch.valid, 4)
        with model.observe(hook):
            hooked = model(batch.tokens, batch.valid, 4)
    assert torch.equal(plain, hooked)
    assert calls == [("core", 0)] * 4
    with pytest.raises(RuntimeError, match="already installed"):
        with model.observe(hook), model.observe(hook):
            pass


def test_every_analysis_kind_of_the_parser_has_its_command():
    from looplab.cli.analyze import KIND_COMMANDS
    from looplab.cli.parser import ANALYSES

    assert list(KIND_COMMANDS) == list(ANALYSES)
