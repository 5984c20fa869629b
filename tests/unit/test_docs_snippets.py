"""The extension guide's snippets (docs/extending.md) run as printed, each adding a working entry to its registry;
the configuration reference lists what each schedule reads, and the command reference names every option."""

import contextlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from looplab import exits, regularisers
from looplab.analysis import registry as metric_registry
from looplab.analysis.mechanistic import analyze_experiment
from looplab.config import ScheduleConfig, load_config
from looplab.errors import LooplabError
from looplab.eval.grid import LengthOutcome
from looplab.eval.metrics import summarize
from looplab.experiment import Experiment, check_config
from looplab.generation.options import DecodeOptions
from looplab.generation.sampling import Sampling
from looplab.schedules import SCHEDULES, ScheduleContext, make_schedule
from looplab.tasks import make_task
from tests.plugin_entries import PLUGIN_ENTRIES, installed

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXTENDING = DOCS / "extending.md"


def _snippets() -> list[str]:
    text = EXTENDING.read_text()
    section = text[text.index("## One entry per family") :]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture
def registries(monkeypatch, request):
    """Run the snippets against copies of the registries, so nothing leaks into other tests."""
    from looplab import token_exits
    from looplab.model import placements
    from looplab.schedules import base
    from looplab.tasks import base as tasks

    for module, name in [
        (base, "SCHEDULES"),
        (base, "_DECLARED"),
        (regularisers, "REGULARISERS"),
        (exits, "EXITS"),
        (exits, "EXIT_PARAMS"),
        (metric_registry, "METRICS"),
        (tasks, "TASKS"),
        (placements, "PLACEMENTS"),
        (token_exits, "EXITS"),
    ]:
        copy = dict(getattr(module, name))
        monkeypatch.setattr(module, name, copy)
    # the decoders and cache policies are read through several modules' names for them: restore them in place
    from looplab.generation import decoders, policies

    for registry in (decoders.DECODERS, policies.POLICIES):
        saved = dict(registry)
        request.addfinalizer(lambda registry=registry, saved=saved: (registry.clear(), registry.update(saved)))
    monkeypatch.setattr("looplab.schedules.SCHEDULES", base.SCHEDULES)
    monkeypatch.setattr("looplab.tasks.TASKS", tasks.TASKS)
    for code in _snippets():
        exec(compile(code, str(EXTENDING), "exec"), {})
    return base.SCHEDULES


def test_there_is_one_snippet_per_family():
    assert len(_snippets()) == 9


def test_the_cache_policy_and_decoder_snippets(registries):
    from looplab.generation import GenerationExit, generate, score
    from tests.unit.model_helpers import make_model

    model = make_model(causal=True, core_layers=2).double()
    prompts, kl = [[3, 4, 5], [3, 6], [3, 4, 4, 6, 5]], GenerationExit("kl", 8, {"eps": 0.01})
    ours = generate(model, prompts, 6, DecodeOptions(kl, "keep_three", decoder="longest_first"))
    ring = generate(model, prompts, 6, DecodeOptions(kl, "last_m", cache_params={"keep_loops": 3}))
    assert ours.tokens == ring.tokens and ours.depths == ring.depths and ours.cache_bytes == ring.cache_bytes
    text = [p + [5, 6] for p in prompts]
    scored = score(model, text, DecodeOptions(kl, "keep_three", decoder="longest_first"))
    reference = score(model, text, DecodeOptions(kl, "keep_three"))
    for ours_row, theirs in zip(scored.logprobs, reference.logprobs, strict=True):
        assert ours_row == pytest.approx(theirs, abs=1e-9)
    with pytest.raises(LooplabError, match="the longest_first decoder is greedy"):
        DecodeOptions(kl, decoder="longest_first", sampling=Sampling(temperature=1.0))


def test_the_generation_exit_snippet(registries):
    from looplab.generation import GenerationExit, generate
    from looplab.token_exits import check_token_exits
    from tests.unit.model_helpers import make_model

    model = make_model(causal=True, core_layers=1)
    prompts = [[3, 4, 5], [3, 6]]
    loose = generate(
        model, prompts, 3, DecodeOptions(GenerationExit("entropy", 5, {"eps": 10.0}))
    )  # below 10 nats from loop 1
    strict = generate(model, prompts, 3, DecodeOptions(GenerationExit("entropy", 5, {"eps": 1e-6})))  # never: the cap
    assert {d for row in loose.depths for d in row} == {1}
    assert {d for row in strict.depths for d in row} == {5}
    assert check_token_exits({"entropy": {"eps": 1}}) == {"entropy": {"eps": 1.0}}
    with pytest.raises(LooplabError, match=r"generate.exits.entropy.eps must be in \(0, inf\)"):
        GenerationExit("entropy", 5, {"eps": 0.0})


def test_the_task_snippet(registries):
    from looplab.tasks.base import make_task as make

    batch = make("reverse", 4).sample(3, 2, torch.Generator().manual_seed(0))
    body = batch.tokens[:, 1:4]  # after the start token
    answers = batch.labels[:, 5:8]
    assert torch.equal(answers, body.flip(1))


def test_the_placement_snippet(registries):
    from looplab.model.norms import Residual

    residual = Residual("normed_residual", "layernorm", 8)
    x, f = torch.randn(2, 3, 8), torch.nn.Linear(8, 8)
    assert residual.norm_out is None
    assert torch.allclose(residual(x, f), residual.norm_in(x) + f(residual.norm_in(x)))


def test_the_schedule_snippet(registries):
    schedule = make_schedule(ScheduleConfig(name="doubled", cap=9), ScheduleContext(make_task("copy"), 16))
    lengths = torch.tensor([1, 3, 6])
    assert schedule.train_depths(lengths, torch.Generator()).tolist() == [2, 6, 9]
    assert schedule.policy_depth(lengths).tolist() == [2, 6, 12]


def test_the_regulariser_snippet(registries):
    on = ["stability.state_energy.weight=0.01", "stability.state_energy.warmup=100"]
    config = load_config(None, ["model.d_model=16", "model.n_heads=2", "model.core_layers=1", *on])
    (found,) = [r for r in regularisers.build_regularisers(config) if r.name == "state_energy"]
    assert (found.weight, found.warmup) == (0.01, 100)


def test_the_exit_snippet(registries):
    confidence = np.log(np.array([[0.5, 0.95, 0.99], [0.1, 0.2, 0.3]]))
    outcome = LengthOutcome(
        5,
        np.array([[False, True, True], [False, False, True]]),
        np.zeros((2, 2), bool),
        np.array([3, 3]),
        confidence=confidence,
    )
    params = exits.exit_params({"first_confident": {"threshold": 0.9}})["first_confident"]
    assert exits.EXITS["first_confident"](outcome, params).tolist() == [2, 3]
    with pytest.raises(LooplabError, match="eval.exits.first_confident.threshold must be in"):
        exits.exit_params({"first_confident": {"threshold": 1.5}})
    assert summarize([outcome], train_max=8)["exits"]["first_confident"]["policy_id"] == pytest.approx(1.0)


def test_the_metric_snippet(registries, tmp_path):
    config = load_config(None, ["model.d_model=16", "model.n_heads=2", "model.core_layers=1", "task.train_max=3"])
    exp = Experiment.build(config)
    summary = analyze_experiment(exp, tmp_path, loops=3, samples=2, mlp_ablation=False)
    assert summary["final_norm_mean"] > 0
    assert (tmp_path / "final_norm.csv").read_text().startswith("token,norm")


def test_the_configuration_reference_lists_what_each_schedule_reads():
    text = (DOCS / "configuration.md").read_text()
    table = text[text.index("| schedule | reads |") :]
    table = table[: table.index("\n\n")]
    listed = {}
    for row in table.splitlines()[2:]:
        names, keys = (cell.strip() for cell in row.strip("|").split("|"))
        for name in re.findall(r"`(\w+)`", names):
            listed[name] = set(re.findall(r"`(\w+)`", keys))
    assert listed == {name: set(cls.keys()) for name, cls in SCHEDULES.items()}


def test_the_command_reference_names_every_option():
    """Each subcommand's line(s) in the command reference's block carry every option its parser accepts."""
    import argparse

    from looplab.cli import build_parser

    text = (DOCS / "commands.md").read_text()
    block = text[text.index("## Command line") :]
    block = block[block.index("```bash") : block.index("```\n", block.index("```bash") + 7)]

    def leaves(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path, parser
            return
        for name, child in subs[0].choices.items():
            yield from leaves(child, [*path, name])

    for path, parser in leaves(build_parser(), []):
        command = " ".join(path[:1] + [p for p in path[1:] if p != "mechanistic"])
        lines = [line for line in block.splitlines() if line.startswith(f"looplab {command} ")]
        assert lines, f"no line in docs/commands.md for looplab {' '.join(path)}"
        options = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        missing = {o for o in options if not any(o in line for line in lines)}
        assert not missing, (path, missing)


def test_every_command_shows_examples_that_parse_and_name_real_presets():
    import shlex

    from looplab.cli import EXAMPLES, parse
    from looplab.config import resolve_preset

    assert set(EXAMPLES) >= {"train", "eval", "mechanistic", "spectral", "pca", "sweep", "report", "reproduce"}
    for lines in EXAMPLES.values():
        for line in lines:
            argv = shlex.split(line.split("   (")[0])[1:]
            args = parse(argv)  # exits on an option the parser does not know
            for name in ("config", "sweep_file"):
                value = getattr(args, name, None)
                if value is not None and not value.endswith("my_sweep.toml"):
                    assert resolve_preset(value).is_file(), (line, value)
            if args.command in ("train", "config"):
                with contextlib.ExitStack() as plugins:  # the example plugins it may name, for this check only
                    for family, entries in PLUGIN_ENTRIES.items():
                        for name in entries:
                            plugins.enter_context(installed(family, name))
                    check_config(load_config(args.config, args.set))  # the example would start
    assert "scaled" not in SCHEDULES  # the plugins were there for the check only


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["analyze", "RUN"], "mechanistic"),
        (["analyze", "--loops", "4", "RUN"], "mechanistic"),  # options before the run dir
        (["analyze", "spectral", "RUN", "--loops", "4"], "spectral"),
        (["analyze", "pca", "RUN"], "pca"),
    ],
)
def test_analyze_without_a_kind_is_the_mechanistic_analysis(argv, kind):
    from looplab.cli import parse

    args = parse(argv)
    assert args.kind == kind and args.run_dir == "RUN"


def test_the_readmes_python_snippet_runs_as_printed(tmp_path, monkeypatch, capsys):
    """README's snippet, with 20 training steps instead of 300: it trains, reads the loss at 1..16 loops
    and generates with the kl exit, each token at its own depth."""
    readme = (DOCS.parent / "README.md").read_text()
    code = readme[readme.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert "train.steps=300" in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code.replace("train.steps=300", "train.steps=20"), "README.md", "exec"), scope)
    completion = scope["completions"][0]
    assert completion.depths and all(1 <= d <= 16 for d in completion.depths)
    summary = scope["summary"]
    assert summary["max_loops"] == 16 and 1 <= summary["best_loops"] <= 16 and summary["best_loss"] > 0
    assert capsys.readouterr().out.strip()


def test_every_headline_number_in_the_readme_is_a_docs_figure_with_its_machine():
    """README's "Three numbers": each ratio is found in the docs (a bench script's figure there), and each
    bullet names its machine and the script."""
    import re

    readme = (DOCS.parent / "README.md").read_text()
    section = readme[readme.index("## Three numbers") :]
    section = section[: section.index("\n## ")]
    bullets = section.split("\n- ")[1:]
    assert len(bullets) <= 3
    docs = "\n".join(p.read_text() for p in [*DOCS.glob("*.md"), *(DOCS / "results").glob("*.md")])
    for bullet in bullets:
        assert re.search(r"AMD EPYC|Intel Xeon", bullet) and "bench/" in bullet, bullet
        for ratio in re.findall(r"(\d+\.\d+)×", bullet):
            assert f"{ratio}×" in docs, f"{ratio}× is in the README but in no docs page"
