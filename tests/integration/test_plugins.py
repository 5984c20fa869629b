"""Plugins from outside the package's registries: one entry per family, used through the CLI and a 2-worker sweep,
a plugin given as a file path, and plugins that cannot be imported refused in one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from looplab.config import PRESETS
from looplab.examples.plugins import MODULES
from tests.conftest import run_cli

PLUGINS = "run.plugins=[" + ", ".join(f'"{module}"' for module in MODULES) + "]"
TINY = [
    "model.d_model=16",
    "model.n_heads=2",
    "model.core_layers=1",
    "task.train_max=4",
    "task.eval_lengths=[2, 4, 6]",
    "train.steps=12",
    "train.batch_size=8",
    "train.log_every=4",
    "train.checkpoint_every=6",
    "eval.samples=16",
    "eval.max_loops=12",
    "run.threads=1",
]
WITH_PLUGINS = [
    PLUGINS,
    "task.name=reverse",
    "schedule.name=scaled",
    "schedule.cap=10",
    "stability.state_energy.weight=0.05",
]


def _sets(*overrides: str) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def test_one_plugin_per_family_trains_evaluates_and_analyses_through_the_cli(tmp_path):
    run = tmp_path / "run"
    trained = run_cli("train", "demo", "--out", str(run), "--no-progress", *_sets(*TINY, *WITH_PLUGINS))
    assert trained.returncode == 0, trained.stderr
    config = (run / "config.toml").read_text()
    assert 'name = "reverse"' in config and "factor = 2" in config and "[stability.state_energy]" in config
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert any("state_energy" in row for row in logged)  # the regulariser ran and was logged

    evaluated = run_cli("eval", str(run))  # the run dir's config names the plugins: nothing else to pass
    assert evaluated.returncode == 0, evaluated.stderr
    assert "first_confident" in evaluated.stdout
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert 1 <= summary["exits"]["first_confident"]["mean_depth"] <= 12
    assert 4 < summary["training_cost"]["block_evals"] <= 8  # scaled: 2 × T(n) ≤ 2 × T(4) = 8, below cap 10

    analysed = run_cli("analyze", str(run), "--loops", "4", "--samples", "2")
    assert analysed.returncode == 0, analysed.stderr
    assert json.loads((run / "analysis" / "mechanistic" / "summary.json").read_text())["final_norm_mean"] > 0


def test_a_two_worker_sweep_imports_the_plugins_in_every_worker(tmp_path):
    sweep = tmp_path / "sweep.toml"
    overrides = ", ".join(f"'{override}'" for override in [*TINY, *WITH_PLUGINS])
    sweep.write_text(f'[sweep]\nconfigs = ["{PRESETS / "demo.toml"}"]\nseeds = 2\nset = [{overrides}]\n')
    out = tmp_path / "out"
    result = run_cli("sweep", str(sweep), "--out", str(out), "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    results = pd.read_parquet(out / "results.parquet")
    assert len(results) == 2 and set(results["schedule.name"]) == {"scaled"}
    assert results["exits.first_confident.mean_depth"].notna().all()
    report = run_cli("report", str(out), "--paper", "oracle_only")  # the paper plugin the runs name
    assert report.returncode == 0, report.stderr
    assert "Ours: Oracle OOD by group" in (out / "report-oracle_only" / "table.md").read_text()


def test_a_plugin_file_path_is_found_again_from_the_run_dir(tmp_path):
    plugin = tmp_path / "plugins" / "every_third.py"
    plugin.parent.mkdir()
    plugin.write_text(
        "from looplab.schedules import DepthRule, register_schedule\n\n\n"
        "@register_schedule\n"
        "class EveryThird(DepthRule):\n"
        '    name = "every_third"\n\n'
        "    @classmethod\n"
        "    def training_depth(cls, params, deepest):\n"
        "        return 3\n\n"
        "    def train_depths(self, lengths, generator):\n"
        "        return lengths * 0 + 3\n\n"
        "    def policy_depth(self, lengths):\n"
        "        return lengths * 0 + 3\n"
    )
    run = tmp_path / "run"
    relative = "run.plugins=['plugins/every_third.py']"
    sets = _sets(*TINY, relative, "schedule.name=every_third")
    trained = run_cli("train", "demo", "--out", str(run), "--no-progress", *sets, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert str(plugin) in (run / "config.toml").read_text()  # stored absolute
    assert run_cli("eval", str(run), cwd="/").returncode == 0


@pytest.mark.parametrize(
    "plugins, message",
    [
        ("['no_such_pkg.thing']", "plugin module 'no_such_pkg.thing' not found"),
        ("['missing/plugin.py']", "missing/plugin.py (run.plugins takes module names or paths to .py files)"),
        ("['broken.py']", "broken.py failed to import: ZeroDivisionError: division by zero"),
        ("['clash.py']", "schedule name 'fixed' is taken by looplab.schedules.rules.Fixed"),
        ("['bare_clash.py']", "schedule name 'fixed' is taken by looplab.schedules.rules.Fixed"),
        ("['task_clash.py']", "task name 'binary_addition' is taken by looplab.tasks."),
        ("['exits.py']", "exits.py called sys.exit(0) on import ("),
        ("['exits_code.py']", "exits_code.py called sys.exit(3) on import ("),
        ("['latin1.py']", "latin1.py is not UTF-8 text (byte 5)"),
    ],
)
def test_a_plugin_that_cannot_be_imported_is_refused_in_one_line(tmp_path, plugins, message):
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    (tmp_path / "clash.py").write_text(
        "from looplab.schedules import register_schedule\n"
        "from looplab.schedules.rules import Matched\n\n\n"
        "@register_schedule\n"
        "class Fixed(Matched):\n"
        '    name = "fixed"\n'
    )
    (tmp_path / "bare_clash.py").write_text(  # the name is the problem, not the methods it leaves out
        "from looplab.schedules import DepthRule, register_schedule\n\n\n"
        "@register_schedule\n"
        "class Fixed(DepthRule):\n"
        '    name = "fixed"\n'
    )
    (tmp_path / "task_clash.py").write_text(  # every family names the clash before the missing methods
        "from looplab.tasks.base import Task, register_task\n\n\n"
        "@register_task\n"
        "class Addition(Task):\n"
        '    name = "binary_addition"\n'
    )
    (tmp_path / "exits.py").write_text("import sys\n\nsys.exit(0)\n")  # would end train silently, with 0
    (tmp_path / "exits_code.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "latin1.py").write_bytes(b"# caf\xe9: Latin-1, which Python skips in a comment\nX = 1\n")
    result = run_cli("train", "demo", "--out", str(tmp_path / "run"), *_sets(f"run.plugins={plugins}"), cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()
