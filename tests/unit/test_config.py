"""Config: defaults, TOML + overrides, validation errors, aliases, round trip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from looplab.config import (
    INJECTIONS,
    NORMS,
    PLACEMENT_ALIASES,
    POSITIONALS,
    PRESETS,
    Config,
    ModelConfig,
    from_dict,
    load_config,
    parse_override,
)
from looplab.errors import LooplabError
from looplab.experiment import check_config
from looplab.model.placements import PLACEMENTS
from looplab.schedules import SCHEDULES
from looplab.tasks import TASKS


def _write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _names_all(message: str, choices) -> None:
    for choice in choices:
        assert re.search(rf"\b{re.escape(choice)}\b", message), (choice, message)


# ----------------------------------------------------------------------------- defaults


def test_defaults_load():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.model.d_model == ModelConfig().d_model
    assert cfg.model.placement in PLACEMENTS
    assert cfg.task.name in TASKS
    assert cfg.schedule.name in SCHEDULES


def test_defaults_are_independent_instances():
    a, b = load_config(None), load_config(None)
    a.task.eval_lengths.append(999)
    assert 999 not in b.task.eval_lengths


# ----------------------------------------------------------------------------- file + overrides


def test_toml_file_and_overrides(tmp_path):
    path = _write(
        tmp_path,
        """
[task]
name = "copy"
train_max = 7

[model]
d_model = 48
n_heads = 4
placement = "post"
""",
    )
    cfg = load_config(
        path,
        ["model.d_model=32", "task.eval_lengths=[4,8]", "schedule.name=window", "train.lr=0.5", "model.causal=true"],
    )
    assert cfg.task.name == "copy"
    assert cfg.task.train_max == 7
    assert cfg.model.d_model == 32  # override wins over the file
    assert cfg.model.n_heads == 4
    assert cfg.model.placement == "post"
    assert cfg.task.eval_lengths == [4, 8]
    assert cfg.schedule.name == "window"  # bare string, not valid TOML, kept as a string
    assert cfg.train.lr == 0.5
    assert cfg.model.causal is True
    # untouched keys keep their defaults
    assert cfg.train.steps == Config().train.steps


def test_override_int_into_float_field_is_coerced():
    cfg = load_config(None, ["train.lr=1", "model.noise_std=2"])
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 1.0
    assert isinstance(cfg.model.noise_std, float) and cfg.model.noise_std == 2.0


def test_later_override_wins():
    cfg = load_config(None, ["model.d_model=32", "model.d_model=16"])
    assert cfg.model.d_model == 16


def test_parse_override_values():
    assert parse_override("model.d_model=32") == (("model", "d_model"), 32)
    assert parse_override("task.eval_lengths=[4, 8]") == (("task", "eval_lengths"), [4, 8])
    assert parse_override("schedule.name=window") == (("schedule", "name"), "window")
    assert parse_override('schedule.name="window"') == (("schedule", "name"), "window")
    assert parse_override("run.device=cuda:0") == (("run", "device"), "cuda:0")
    assert parse_override("model.causal=false") == (("model", "causal"), False)
    assert parse_override("stability.jsrr.weight=0.2") == (("stability", "jsrr", "weight"), 0.2)


@pytest.mark.parametrize("text", ["model.d_model", "d_model=3", "=3"])
def test_malformed_override(text):
    with pytest.raises(LooplabError):
        load_config(None, [text])


# ----------------------------------------------------------------------------- errors


def test_unknown_section():
    with pytest.raises(LooplabError) as err:
        load_config(None, ["modle.d_model=32"])
    assert "modle" in str(err.value)
    _names_all(str(err.value), ["task", "model", "schedule", "train", "eval", "run"])


def test_unknown_section_in_file(tmp_path):
    path = _write(tmp_path, "[bogus]\nx = 1\n")
    with pytest.raises(LooplabError) as err:
        load_config(path)
    _names_all(str(err.value), ["task", "model", "schedule", "train", "eval", "run"])


def test_unknown_key():
    with pytest.raises(LooplabError) as err:
        load_config(None, ["model.d_modle=32"])
    message = str(err.value)
    assert "d_modle" in message
    _names_all(message, ["d_model", "n_heads", "placement", "injection"])


@pytest.mark.parametrize(
    "override, where",
    [
        ('model.d_model="big"', "model.d_model"),
        ("model.d_model=true", "model.d_model"),
        ("model.d_model=32.0", "model.d_model"),
        ("train.lr=true", "train.lr"),
        ('train.lr="fast"', "train.lr"),
        ("model.causal=1", "model.causal"),
        ("model.norm=3", "model.norm"),
        ("task.eval_lengths=4", "task.eval_lengths"),
        ('task.eval_lengths=[4, "x"]', "task.eval_lengths"),
        ("task.eval_lengths=[4, true]", "task.eval_lengths"),
    ],
)
def test_wrong_type(override, where):
    with pytest.raises(LooplabError) as err:
        load_config(None, [override])
    assert where in str(err.value)


def test_wrong_type_in_file(tmp_path):
    path = _write(tmp_path, '[train]\nsteps = "many"\n')
    with pytest.raises(LooplabError, match="train.steps"):
        load_config(path)


def test_section_not_a_table(tmp_path):
    path = _write(tmp_path, "model = 3\n")
    with pytest.raises(LooplabError):
        load_config(path)


@pytest.mark.parametrize(
    "key, choices",
    [
        ("model.norm", NORMS),
        ("model.placement", PLACEMENTS),
        ("model.injection", INJECTIONS),
        ("model.init_state", ("embed", "zeros", "noise")),
        ("model.positional", POSITIONALS),
        ("model.attention", ("auto", "sdpa", "math")),
        ("model.init_scaling", ("none", "sqrt_d")),
        ("model.inject_init", ("sum", "state", "input", "mix", "random")),
        ("run.precision", ("fp32", "bf16")),
        ("schedule.name", ("fixed", "matched", "window", "fixed_window", "multi_depth")),
        ("task.name", ("copy", "unique_set", "binary_addition", "dyck1", "parity", "decimal_addition")),
    ],
)
def test_bad_choice_names_valid_choices(key, choices):
    # task and schedule names are checked against their registries, above the config schema
    with pytest.raises(LooplabError) as err:
        check_config(load_config(None, [f'{key}="nonsense_value"']))
    message = str(err.value)
    assert "nonsense_value" in message
    assert key in message
    _names_all(message, choices)


def test_placement_aliases():
    assert PLACEMENT_ALIASES == {"sandwich_output": "pre_sandwich", "sandwich_residual": "post_sandwich"}
    assert load_config(None, ["model.placement=sandwich_output"]).model.placement == "pre_sandwich"
    assert load_config(None, ["model.placement=sandwich_residual"]).model.placement == "post_sandwich"
    for placement in PLACEMENTS:
        assert load_config(None, [f"model.placement={placement}"]).model.placement == placement


def test_d_model_not_divisible_by_heads():
    with pytest.raises(LooplabError, match="n_heads"):
        load_config(None, ["model.d_model=30", "model.n_heads=4"])
    # divisible is fine
    assert load_config(None, ["model.d_model=32", "model.n_heads=4"]).model.d_model == 32


def test_rope_needs_even_head_dim():
    with pytest.raises(LooplabError, match="rope"):
        load_config(None, ["model.d_model=6", "model.n_heads=2"])
    cfg = load_config(None, ["model.d_model=6", "model.n_heads=2", "model.positional=nope"])
    assert cfg.model.d_model == 6


@pytest.mark.parametrize(
    "override",
    [
        "model.core_layers=0",
        "task.train_min=0",
        "task.train_min=9",
        "task.eval_lengths=[]",
        "train.steps=-1",
        "train.lr=0",
        "eval.max_loops=0",
        "run.device=tpu",
        "model.init_std=0",
        "model.init_std=-0.02",
        "model.init_std=inf",
        "model.init_std=nan",
        "model.embed_std=0",
        "model.embed_std=-1",
        "model.inject_gain=0",
        "model.inject_gain=-inf",
    ],
)
def test_range_checks(override):
    extra = ["task.train_max=8"] if override.startswith("task.train_min") else []
    with pytest.raises(LooplabError):
        load_config(None, extra + [override])


def test_init_errors_name_the_key_and_the_domain():
    with pytest.raises(LooplabError, match=r"model\.init_std must be in \(0, inf\), got -1\.0"):
        load_config(None, ["model.init_std=-1"])


def test_zero_steps_is_an_untrained_run():
    assert load_config(None, ["train.steps=0"]).train.steps == 0


# ----------------------------------------------------------------------------- round trip, files


def test_round_trip(tmp_path):
    cfg = load_config(
        None,
        [
            "model.d_model=32",
            "model.placement=sandwich_residual",
            "task.eval_lengths=[3,5,9]",
            "schedule.name=fixed_window",
            "model.causal=true",
            "train.lr=0.002",
            "model.positional=learned",
            "run.device=cuda:1",
        ],
    )
    path = _write(tmp_path, cfg.to_toml())
    again = load_config(path)
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    assert again.model.placement == "post_sandwich"


def test_round_trip_defaults(tmp_path):
    path = _write(tmp_path, Config().to_toml())
    assert load_config(path) == Config()


def test_from_dict_matches_load():
    data = {"model": {"d_model": 32}, "task": {"name": "parity"}}
    assert from_dict(data) == load_config(None, ["model.d_model=32", "task.name=parity"])


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(LooplabError) as err:
        load_config(missing)
    assert "nope.toml" in str(err.value)


def test_invalid_toml_file(tmp_path):
    path = _write(tmp_path, "[model\nd_model = 3\n")
    with pytest.raises(LooplabError):
        load_config(path)


def test_bundled_demo_config_loads():
    demo = Path(__file__).resolve().parents[2] / "looplab" / "configs" / "demo.toml"
    cfg = load_config(demo)
    assert cfg.task.name == "binary_addition"
    assert cfg.task.train_max == 10


RUN_PRESETS = sorted(
    path
    for path in PRESETS.rglob("*.toml")
    # model-dir/ presets name their dir on the command line: tests/integration/test_finetune_model_dir.py checks them
    if path.relative_to(PRESETS).parts[0] not in ("sweeps", "model-dir") and not path.name.startswith("retrofit")
)


@pytest.mark.parametrize("path", RUN_PRESETS, ids=lambda p: str(p.relative_to(PRESETS)))
def test_every_run_preset_loads_and_checks(path):
    config = load_config(path)
    check_config(config)
    assert tuple(config.schedule.params) == SCHEDULES[config.schedule.name].keys()


@pytest.mark.parametrize(
    "section, exits",
    [
        ({"fixed_exit": 8, "max_loops": 12}, {"fixed": {"depth": 8}, "convergence": {"eps": 1e-3}}),
        ({"convergence_eps": 0.01}, {"fixed": {"depth": 0}, "convergence": {"eps": 0.01}}),
        (
            {"fixed_exit": 3, "exits": {"convergence": {"eps": 0.1}}},
            {"fixed": {"depth": 3}, "convergence": {"eps": 0.1}},
        ),
        ({"exits": {"fixed": {"depth": 4}}}, {"fixed": {"depth": 4}, "convergence": {"eps": 1e-3}}),
    ],
)
def test_exit_parameters_read_from_their_tables_and_from_the_earlier_keys(section, exits):
    config = from_dict({"eval": section})
    check_config(config)
    assert config.eval.exits == exits
    assert from_dict(config.to_dict()).eval.exits == exits  # a run dir's config.toml reads back the same


# ----------------------------------------------------------------------------- checked once
def test_a_checked_config_is_not_checked_again_unless_it_changed(monkeypatch):
    import looplab.experiment as experiment

    config = load_config(None, ["schedule.name=fixed", "schedule.depth=4"])
    assert not experiment.is_checked(config)
    calls = []
    original = experiment.check_config
    monkeypatch.setattr(experiment, "check_config", lambda c: calls.append(c) or original(c))
    assert experiment.checked(config) is config and experiment.is_checked(config)
    experiment.Experiment.build(experiment.on_device(config, "cpu"))  # a rank's copy keeps the mark
    assert len(calls) == 1
    config.schedule.params["depth"] = 0  # changed after its check: checked again, and refused
    with pytest.raises(LooplabError, match=r"schedule.depth must be in \[1, inf\) for the fixed schedule, got 0"):
        experiment.Experiment.build(config)
    assert len(calls) == 2
