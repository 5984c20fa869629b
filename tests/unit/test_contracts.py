"""The contracts of the task, regulariser, exit, norm-placement, metric and generation-exit families, run on
every registered entry and on the example plugins (the schedule contract has its own module)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import get_type_hints

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import jvp

from looplab.analysis.mechanistic import analyze_experiment
from looplab.analysis.registry import METRICS, AnalysisInput, AnalysisOptions, MetricResult
from looplab.config import ModelConfig, load_config
from looplab.errors import LooplabError
from looplab.eval.grid import LengthOutcome
from looplab.exits import EXITS, exit_params
from looplab.experiment import Experiment
from looplab.model import LoopedTransformer
from looplab.model.norms import Residual
from looplab.model.protocol import LoopProbe
from looplab.model.tangent import linearise_residual
from looplab.model.trace import trace
from looplab.params import domain_of
from looplab.regularisers import REGULARISERS
from looplab.tasks import IGNORE, PAD, TASKS, make_task
from looplab.token_exits import EXITS as TOKEN_EXITS
from looplab.token_exits import GenerationExit, check_token_exits, token_exit_params
from tests.plugin_entries import installed, names

TASK = make_task("binary_addition")


# ---------------------------------------------------------------- tasks


@pytest.mark.parametrize("name", [n for n in names("task") if not getattr(TASKS.get(n), "needs_causal", False)])
def test_task_samples_are_seeded_padded_and_supervised(name):
    with installed("task", name):
        task = make_task(name)
        lengths = task.min_size + torch.tensor([0, 1, 2, 1])
        first = task.sample_lengths(lengths, torch.Generator().manual_seed(0))
        again = task.sample_lengths(lengths, torch.Generator().manual_seed(0))
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.labels, again.labels)
    assert first.tokens.shape == first.labels.shape == first.valid.shape
    assert bool((first.tokens[~first.valid] == PAD).all())
    assert bool(first.answer_mask.any(dim=1).all()), "every row supervises at least one position"
    labels = first.labels[first.labels != IGNORE]
    assert int(labels.min()) >= 0 and int(labels.max()) < task.vocab_size
    steps = task.steps(lengths)
    assert steps.dtype == torch.long and int(steps.min()) >= 1


# ---------------------------------------------------------------- regularisers


def _probe(rows: int = 3) -> tuple[LoopedTransformer, LoopProbe]:
    torch.manual_seed(0)
    model = LoopedTransformer(ModelConfig(d_model=8, n_heads=2, core_layers=1), TASK.vocab_size).double()
    batch = TASK.sample(3, rows, torch.Generator().manual_seed(1))
    h, e, ctx = model.start(batch.tokens, batch.valid)
    return model, LoopProbe(model.step(h, e, ctx), e, batch.valid)


@pytest.mark.parametrize("name", names("regulariser"))
def test_regulariser_declares_its_keys_and_gives_a_differentiable_penalty_per_sample(name):
    with installed("regulariser", name):
        cls = REGULARISERS[name]
        defaults = cls.Params()
        assert not cls.active(defaults), "a registered regulariser is off until a config turns it on"
        for declared in dataclasses.fields(cls.Params):
            assert domain_of(declared) is not None or declared.type == "bool", declared.name
        on = {"weight": 0.1} if name != "jsrr" else {"estimator": "jvp"}
        regulariser = cls(**on)
        assert cls.active(regulariser.params)
        model, probe = _probe()
        values = regulariser.penalty(model, probe, torch.Generator().manual_seed(0))
    assert values.shape == (3,) and bool(torch.isfinite(values).all())
    values.mean().backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())


# ---------------------------------------------------------------- exits


def _outcome(count: int = 6, steps: int = 5) -> LengthOutcome:
    rng = np.random.default_rng(0)
    return LengthOutcome(
        length=4,
        correct=rng.random((count, steps)) < 0.5,
        flips=rng.random((count, steps - 1)) < 0.3,
        policy_depth=rng.integers(1, steps + 1, count),
        confidence=np.log(rng.random((count, steps))),
        state_norm=np.ones((count, steps)),
        step_norm=rng.random((count, steps)) * 1e-2,
        hazard_logits=rng.normal(size=(count, steps)).astype(np.float32),
    )


@pytest.mark.parametrize("name", names("exit"))
def test_exit_gives_a_depth_in_1_to_T_per_sample_or_none(name):
    with installed("exit", name):
        rule = EXITS[name]
        full = rule(_outcome(), exit_params({"fixed": {"depth": 3}})[name])
        bare = rule(
            dataclasses.replace(_outcome(), confidence=None, state_norm=None, step_norm=None, hazard_logits=None),
            exit_params({})[name],
        )
    for depths in (full, bare):
        if depths is not None:
            depths = np.asarray(depths)
            assert depths.shape == (6,) and np.issubdtype(depths.dtype, np.integer)
            assert depths.min() >= 1 and depths.max() <= 5
    assert full is not None, "with every signal recorded, an exit answers"


@pytest.mark.parametrize("name", names("exit"))
def test_exit_declares_its_parameters_with_checked_defaults_and_a_description(name):
    with installed("exit", name):
        params = exit_params({})[name]  # fill checks every default against its domain
    assert dataclasses.is_dataclass(params)
    for declared in dataclasses.fields(params):
        assert declared.metadata.get("doc"), f"eval.exits.{name}.{declared.name} needs a one-line description"


# ---------------------------------------------------------------- norm placements


@pytest.mark.parametrize("name", names("placement"))
def test_placement_linearisation_is_the_derivative_of_its_forward(name):
    torch.manual_seed(0)
    with installed("placement", name):
        residual = Residual(name, "layernorm", 8).double()
    for module in residual.modules():
        for parameter in module.parameters():
            torch.nn.init.normal_(parameter)
    f = torch.nn.Linear(8, 8).double()
    x, v = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    out, tangent = linearise_residual(residual, x, lambda y: (f(y), lambda dy: F.linear(dy, f.weight)))
    assert torch.allclose(out, residual(x, f), atol=1e-12)
    assert torch.allclose(tangent(v), jvp(lambda z: residual(z, f), (x,), (v,))[1], atol=1e-10)


# ---------------------------------------------------------------- metrics


@pytest.fixture(scope="module")
def analysed_inputs():
    config = load_config(None, ["model.d_model=16", "model.n_heads=2", "model.core_layers=1", "task.train_max=3"])
    exp = Experiment.build(config)
    batch = exp.task.sample(3, 2, torch.Generator().manual_seed(0))

    def retrace():
        return trace(exp.model, batch.tokens, batch.valid, 4, attention=True)

    options = AnalysisOptions(loops=4, samples=2, max_period=2, mlp_ablation=False)
    return AnalysisInput(exp, retrace(), "tiny", retrace, options)


@pytest.mark.parametrize("name", names("metric"))
def test_metric_returns_json_summary_entries_tables_and_plots(name, analysed_inputs, tmp_path):
    with installed("metric", name):
        result = METRICS[name](analysed_inputs)
    assert isinstance(result, MetricResult)
    text = json.dumps(result.summary)  # JSON-able
    assert all(not isinstance(v, float) or math.isfinite(v) or math.isnan(v) for v in json.loads(text).values())
    for file, (header, rows) in result.tables.items():
        assert file.endswith(".csv") and all(len(list(row)) == len(header) for row in rows)
    for file, draw in result.plots.items():
        draw(tmp_path / file)
        assert (tmp_path / file).exists() or (tmp_path / f"{file}.png").exists() or any(tmp_path.iterdir())


def test_a_plugin_metric_is_written_by_the_one_runner(tmp_path):
    exp = Experiment.build(load_config(None, ["model.d_model=16", "model.n_heads=2", "model.core_layers=1"]))
    with installed("metric", "final_norm"):
        summary = analyze_experiment(exp, tmp_path, loops=3, samples=2, mlp_ablation=False)
    assert summary["final_norm_mean"] > 0
    assert (tmp_path / "final_norm.csv").read_text().startswith("token,norm")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"window": 1}, r"analysis\.window must be 0 \(automatic\) or >= 2, got 1"),
        ({"loops": 0}, r"analysis\.loops must be in \[1, inf\), got 0"),
        ({"tol": -1.0}, r"analysis\.tol must be in \(0, inf\), got -1.0"),
        ({"depth": 3}, r"unknown key in \[analysis\] 'depth'; valid choices: loops, max_period"),
    ],
)
def test_analysis_options_are_declared_and_checked(options, message, tmp_path):
    exp = Experiment.build(load_config(None, ["model.d_model=16", "model.n_heads=2", "model.core_layers=1"]))
    with pytest.raises(LooplabError, match=message):
        analyze_experiment(exp, tmp_path, samples=2, **options)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- generation exits


@pytest.mark.parametrize("name", names("token_exit"))
def test_token_exit_answers_per_row_and_the_cap_always_stops(name):
    generator = torch.Generator().manual_seed(0)
    h, h_prev = torch.randn(5, 8, generator=generator), torch.randn(5, 8, generator=generator)
    logp = torch.log_softmax(torch.randn(5, 11, generator=generator), -1)
    logp_prev = torch.log_softmax(torch.randn(5, 11, generator=generator), -1)
    with installed("token_exit", name):
        rule = GenerationExit(name, loops=4, halts=lambda h, t: h[:, 0] > 0)
        read = (logp, logp_prev) if rule.reads_logits else (None, None)
        carried = rule.start(5, h.device)
        assert (carried is None) == (not rule.carries)
        for t in (1, 2, 3):
            stop, after = rule.check(t, h, h_prev, *read, carried)
            assert stop.shape == (5,) and stop.dtype == torch.bool
            assert rule.adaptive or not stop.any()  # an exit that says it never stops early does not
            # each row's decision and state are its own: two rows alone answer as they do in the batch
            part = [None if x is None else x[1:3] for x in (*read, carried)]
            alone, alone_after = rule.check(t, h[1:3], h_prev[1:3], *part)
            assert torch.equal(alone, stop[1:3])
            assert (after is None) == (not rule.carries) and (after is None or torch.equal(alone_after, after[1:3]))
            carried = after
        assert bool(rule.check(4, h, h_prev, logp, logp_prev, carried)[0].all())
        without_head = GenerationExit(name, loops=4)
        if rule.needs_head:  # it says so: a call without the head is refused, not answered
            with pytest.raises(LooplabError, match="halting head"):
                without_head.check(1, h, h_prev, logp, logp_prev, without_head.start(5, h.device))


def _count_start(rows, device):
    return torch.zeros(rows, 1, dtype=torch.long, device=device)


#: what a plugin exit that carries state may wrongly return, and the line that refuses it
BAD_CARRIES = [
    (lambda h: h[:, 0] > 0, "carries state but returned Tensor; an exit that carries state returns (stop, state)"),
    (lambda h: (h[:, 0] > 0, None), "carries state but returned None as it"),
    (lambda h: (h[:, 0] > 0, torch.zeros(len(h), 2, dtype=torch.long)), "returned torch.int64 [5, 2] as it"),
    (lambda h: (h[:, 0] > 0, torch.zeros(len(h), 1)), "returned torch.float32 [5, 1] as it"),
    (lambda h: (h[:, 0] > 0, torch.zeros(3, 1, dtype=torch.long)), "returned a state of 3 rows for 5"),
]


@pytest.mark.parametrize("answer, message", BAD_CARRIES, ids=range(len(BAD_CARRIES)))
def test_an_exit_that_carries_state_and_loses_it_is_refused_in_one_line(monkeypatch, answer, message):
    from looplab.token_exits import TokenExit

    def stops(rule, t, h, h_prev, logp, logp_prev, carried):
        return answer(h)

    monkeypatch.setitem(TOKEN_EXITS, "counting", TokenExit("counting", False, 1, stops, carries=_count_start))
    rule = GenerationExit("counting", 4)
    h = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(LooplabError, match="^generation exit 'counting'") as refused:
        rule.check(1, h, h, None, None, rule.start(5, h.device))
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("name", names("token_exit"))
def test_token_exit_declares_its_parameters_and_its_config_table_round_trips(name):
    with installed("token_exit", name):
        declared = TOKEN_EXITS[name].params
        types = get_type_hints(declared)
        for field in dataclasses.fields(declared):
            assert domain_of(field) is not None or types[field.name] is bool, field.name
        defaults = dataclasses.asdict(token_exit_params(name))
        assert check_token_exits({name: defaults}) == {name: defaults}  # a table of every key round-trips
        assert check_token_exits({name: {}}) == {name: {}}  # and holds only what it sets
        assert token_exit_params(name, {name: defaults}) == token_exit_params(name)
        assert GenerationExit(name, 4, defaults) == GenerationExit(name, 4)
        with pytest.raises(LooplabError, match=rf"unknown key in \[generate.exits.{name}\] 'no_such_key'"):
            token_exit_params(name, no_such_key=1)


# ---------------------------------------------------------------- papers


def _ours():
    import pandas as pd

    from looplab.report.build import sweep_statistics

    results = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "run_dir": ["runs/a", "runs/b", "runs/c"],
            "task.name": "binary_addition",
            "variant": ["fixed", "fixed", "window"],
            "run.seed": [1, 2, 1],
            "task.train_max": 8,
            "task.alphabet": 2,
            "task.eval_lengths": "[4, 8, 16]",
            "schedule.name": ["fixed", "fixed", "window"],
            "schedule.depth": 10,
            "training_cost.block_evals": 10.0,
            "front90": 8,
            "oracle_id": 1.0,
            "oracle_ood": [0.4, 0.5, 0.6],
            "policy_ood": [0.3, 0.4, 0.6],
            "gap": [0.1, 0.1, 0.0],
        }
    )
    return results, sweep_statistics(results)


@pytest.mark.parametrize("name", names("paper"))
def test_paper_builds_its_tables_and_draws_nothing_for_a_sweep_without_its_runs(name, tmp_path):
    import re

    from looplab.report.comparison import PAPER_TABLES_DIR
    from looplab.report.paper import PAPERS
    from looplab.report.tables import Table

    results, ours = _ours()
    with installed("paper", name):
        paper = PAPERS[name]
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name)  # a reproduction sweep is NAME-<scale>.toml
        tables, notes = paper.tables(ours, PAPER_TABLES_DIR)
        assert all(isinstance(t, Table) for t in tables) and all(isinstance(n, str) for n in notes)
        if paper.run_tables is not None:
            assert all(isinstance(t, Table) for t in paper.run_tables(results, tmp_path, PAPER_TABLES_DIR))
        if paper.figures is not None:
            assert paper.figures(tmp_path, results, tmp_path) == ([], {})
        assert set(paper.files) >= set() and all(isinstance(c, str) for c in paper.captions.values())
        assert all(isinstance(kinds, tuple) for kinds in paper.figures_after.values())
