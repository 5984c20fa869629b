"""The reproduction sweeps shipped in configs/sweeps expand to the studies docs/commands.md promises."""

from __future__ import annotations

import tomllib
from collections import Counter

import pytest

from looplab.cli import PRESETS, STUDIES
from looplab.cli.parser import PAPER_NAMES
from looplab.config import from_dict, load_config
from looplab.experiment import check_config, training_depth
from looplab.memory import GIB, training_bytes
from looplab.report.paper import PAPERS
from looplab.studies import load_studies
from looplab.sweep import load_sweep
from looplab.tasks import make_task

load_studies()  # the papers, page blocks and collectors these tests read are registered by the studies


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_has_a_loadable_sweep(study):
    points = load_sweep(PRESETS / "sweeps" / f"{study}.toml").points()
    assert points and all("threads = 1" in p.config_toml for p in points)


def test_stopping_small_is_the_pilot_protocol():
    points = load_sweep(PRESETS / "sweeps" / "stopping-small.toml").points()
    assert len(points) == 80
    configs = [tomllib.loads(p.config_toml) for p in points]
    assert Counter((c["task"]["name"], p.variant) for c, p in zip(configs, points)) == {
        **{("dyck1", v): 8 for v in ("fixed", "matched", "window", "rl_halting", "rl_halting-ent0", "pondernet")},
        **{("binary_addition", v): 8 for v in ("fixed", "matched", "window", "rl_halting")},
    }
    assert sorted({c["run"]["seed"] for c in configs}) == list(range(8))
    for c in configs:  # one causal NoPE layer, a window of 1: an answer at position i needs about i loops
        model = c["model"]
        assert (model["core_layers"], model["positional"], model["causal"], model["attention_window"]) == (
            1,
            "nope",
            True,
            1,
        )
        assert c["task"]["eval_lengths"][-1] == 3 * c["task"]["train_max"]
        # the paper's T_test = 1.5 T_train, T_train as each schedule defines it
        assert c["eval"]["max_loops"] == 3 * training_depth(from_dict(c)) // 2
        assert c["train"]["steps"] == 600


def test_stars_lm_is_two_shapes_by_three_recipes_on_the_papers_lm_settings():
    points = load_sweep(PRESETS / "sweeps" / "stars-lm.toml").points()
    configs = [tomllib.loads(p.config_toml) for p in points]
    assert Counter(p.variant for p in points) == {
        f"{shape}-{recipe}": 3
        for shape in ("pre_sandwich", "post_sandwich")
        for recipe in ("fixed", "lognormal", "stars")
    }
    for c, point in zip(configs, points):
        model, schedule = c["model"], c["schedule"]
        assert c["task"]["name"] == "kjv_arithmetic" and model["causal"] and model["injection"] == "none"
        assert (model["norm"], model["placement"]) == ("rmsnorm", point.variant.split("-")[0])
        assert schedule["depth"] == 4 and c["eval"]["max_loops"] == 64
        if not point.variant.endswith("fixed"):
            assert (schedule["name"], schedule["mu"], schedule["sigma"], schedule["lo"], schedule["hi"]) == (
                "lognormal",
                1.7,
                0.4,
                1,
                16,
            )
            assert schedule["per_batch"]
        jsrr = c.get("stability", {}).get("jsrr", {})
        assert (jsrr.get("estimator"), jsrr.get("weight")) == (
            ("jvp", 0.1) if point.variant.endswith("stars") else ("none", 0.1)
        )


def test_every_study_is_package_data_and_named_after_a_registered_paper():
    assert set(STUDIES) >= {"stopping-small", "stopping-paper", "stars-small", "stars-paper", "stars-lm"}
    assert all((PRESETS / "sweeps" / f"{study}.toml").is_file() for study in STUDIES)
    assert all(study.split("-")[0] in PAPERS for study in STUDIES)
    assert set(PAPER_NAMES) == set(PAPERS)  # the help texts name the registered papers


def test_mechanistic_small_is_the_untrained_ablation():
    spec = load_sweep(PRESETS / "sweeps" / "mechanistic-small.toml")
    points = spec.points()
    options = spec.options
    assert len(points) == 36 and not options.evaluate and options.analyze and options.analyze_loops == 128
    configs = [tomllib.loads(p.config_toml) for p in points]
    assert Counter((c["model"]["placement"], c["model"]["injection"]) for c in configs) == {
        (placement, injection): 6
        for placement in ("pre", "pre_sandwich", "post_sandwich")
        for injection in ("concat", "none")
    }
    for c in configs:
        assert c["train"]["steps"] == 0 and c["model"]["core_layers"] == 12
        assert c["model"]["prelude_layers"] == c["model"]["coda_layers"] == 0
        assert (
            c["model"]["init_std"],
            c["model"]["init_scaling"],
            c["model"]["embed_std"],
            c["model"]["inject_init"],
        ) == (0.4, "sqrt_d", 1.0, "random")


STOPPING_PILOTS = sorted(p for p in (PRESETS / "sweeps" / "pilot").glob("*.toml") if p.stem != "stars-finetune")


@pytest.mark.parametrize("path", STOPPING_PILOTS, ids=lambda p: p.stem)
def test_the_stopping_pilot_cells_expand_to_what_their_names_say(path):
    configs = [tomllib.loads(p.config_toml) for p in load_sweep(path).points()]
    model = {(c["model"]["core_layers"], c["model"]["attention_window"], c["model"]["positional"]) for c in configs}
    assert model == ({(1, 1, "nope")} if "window1" in path.stem or "steps" in path.stem else {(3, 0, "nope")})
    assert {c["task"]["name"] for c in configs} == {path.stem.split("-")[0]}


def test_recursive_paper_runs_trms_recursion_at_the_papers_depth_within_one_80_gib_gpu():
    """TRM's n = 6, T = 3, N_sup = 16 on both puzzles, each arm's training estimate under 80 GiB."""

    spec = load_sweep(PRESETS / "sweeps" / "recursive-paper.toml")
    tasks = set()
    for path in spec.configs:
        config = load_config(path)
        check_config(config)
        tasks.add(config.task.name)
        assert (config.model.recurrence, config.model.latent_steps, config.model.d_model) == ("trm", 6, 512)
        assert (config.train.segment_loops, config.train.backprop_loops, training_depth(config)) == (3, 1, 48)
        assert training_bytes(config, make_task(config.task.name), training_depth(config)) < 80 * GIB
    assert tasks == {"sudoku9_hard", "maze"} and len(spec.seeds) >= 5
    assert max(load_config(p).task.eval_lengths[-1] for p in spec.configs if "maze" in p.name) == 30


def test_the_stars_finetune_study_shares_a_pretrain_per_seed_and_shape_and_its_pilot_uses_no_study_seed():
    study = load_sweep(PRESETS / "sweeps" / "stars-finetune.toml")
    points = study.points()
    pretrained = [p for p in points if p.after is None]
    assert len(points) == 75 and len(pretrained) == 20  # 11 arms and 4 model shapes × 5 seeds
    for point in points:
        config = tomllib.loads(point.config_toml)
        if point.after is None:
            assert config["schedule"] == {**config["schedule"], "name": "fixed", "depth": 4}
            assert config["train"]["steps"] == 800
        else:
            assert config["train"]["steps"] == 400 and config["eval"]["max_loops"] == 128
    pilot = load_sweep(PRESETS / "sweeps" / "pilot" / "stars-finetune.toml")
    assert not set(pilot.seeds) & set(study.seeds)
    resolved = [{path.resolve() for path in (*spec.configs, spec.pretrain)} for spec in (pilot, study)]
    assert resolved[0] <= resolved[1]
