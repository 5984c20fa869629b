"""The command line end to end: train, eval, config show, and one-line errors."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli, train_tiny_run


def _one_line_error(result) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("cli"), 20, 10)


def test_train_writes_run_dir(trained_run):
    _, run_dir = trained_run
    assert (run_dir / "config.toml").is_file()
    assert (run_dir / "checkpoints" / "step_0000020" / "model.safetensors").is_file()
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [5, 10, 15, 20]
    assert all(r["loss"] > 0 for r in log)
    assert any(p.name.startswith("events") for p in (run_dir / "tensorboard").iterdir())


def test_eval_writes_grid_and_summary(trained_run):
    _, run_dir = trained_run
    result = run_cli("eval", str(run_dir), "--lengths", "4,6,9", "--max-loops", "8", "--samples", "24")
    assert result.returncode == 0, result.stderr
    assert "Oracle OOD" in result.stdout and "Front@90" in result.stdout
    # other settings than the run's [eval] are written beside eval/, named by what differs
    out = run_dir / "eval" / "lengths4-6-9_loops8_samples24"
    assert f"wrote {out}" in result.stdout and "next: looplab analyze" in result.stdout
    grid = pd.read_parquet(out / "grid.parquet")
    assert {"length", "loops", "accuracy"} <= set(grid.columns)
    assert len(grid) == 3 * 8 and grid["accuracy"].between(0, 1).all()
    summary = json.loads((out / "summary.json").read_text())
    for key in ("oracle_id", "oracle_ood", "policy_ood", "gap", "front90", "flip_rate", "per_length"):
        assert key in summary
    assert set(summary["per_length"]) == {"4", "6", "9"}
    assert summary["per_length"]["9"]["split"] == "ood" and summary["per_length"]["6"]["split"] == "id"
    for key in ("oracle_id", "oracle_ood", "policy_ood", "flip_rate"):
        assert 0.0 <= summary[key] <= 1.0


def test_reevaluation_with_other_settings_writes_beside_the_original(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    trained = run_cli("train", str(tiny_config(steps=10)), "--out", str(run_dir))
    # not a terminal: the run says how far it is, and what to run next
    assert "train: 10/10 (100%), loss" in trained.stdout and f"next: looplab eval {run_dir}" in trained.stdout
    assert run_cli("eval", str(run_dir)).returncode == 0
    original = (run_dir / "eval" / "summary.json").read_text()
    again = run_cli("eval", str(run_dir), "--max-loops", "5")
    assert again.returncode == 0 and f"wrote {run_dir / 'eval' / 'loops5'}" in again.stdout
    assert (run_dir / "eval" / "summary.json").read_text() == original
    assert json.loads((run_dir / "eval" / "loops5" / "summary.json").read_text())["max_loops"] == 5


def test_config_show_applies_overrides(tiny_config):
    result = run_cli(
        "config", "show", str(tiny_config()), "--set", "model.d_model=48", "--set", "model.placement=sandwich_residual"
    )
    assert result.returncode == 0, result.stderr
    assert "d_model = 48" in result.stdout and 'placement = "post_sandwich"' in result.stdout


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.colour=3", "valid choices"),
        ("model.norm=batchnorm", "layernorm"),
        ("model.d_model=abc", "must be int"),
        ("schedule.name=sometimes", "matched"),
    ],
)
def test_bad_config_is_one_line_exit_2(tiny_config, tmp_path, override, needle):
    result = run_cli("train", str(tiny_config()), "--set", override, "--out", str(tmp_path / "never"))
    assert needle in _one_line_error(result)
    assert not (tmp_path / "never").exists()


def test_missing_run_dir_and_config(tmp_path):
    assert "not found" in _one_line_error(run_cli("eval", str(tmp_path / "nope")))
    assert "not found" in _one_line_error(run_cli("train", str(tmp_path / "nope.toml"), "--out", str(tmp_path)))


def test_corrupt_checkpoint_is_reported_and_left_alone(trained_run, tmp_path):
    _, run_dir = trained_run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    weights = copy / "checkpoints" / "step_0000020" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    before = weights.read_bytes()
    assert "corrupt" in _one_line_error(run_cli("eval", str(copy)))
    assert weights.read_bytes() == before


def test_mismatched_checkpoint_is_reported(trained_run, tmp_path):
    config, run_dir = trained_run
    other = tmp_path / "other"
    result = run_cli(
        "train",
        str(config),
        "--set",
        "model.d_model=16",
        "--set",
        "train.steps=2",
        "--out",
        str(other),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    shutil.rmtree(other / "checkpoints")
    shutil.copytree(run_dir / "checkpoints", other / "checkpoints")
    assert "does not match" in _one_line_error(run_cli("eval", str(other)))


def test_changed_config_on_existing_run_dir_is_refused(trained_run):
    config, run_dir = trained_run
    before = (run_dir / "config.toml").read_text()
    result = run_cli("train", str(config), "--set", "train.lr=0.5", "--out", str(run_dir))
    assert "train.lr" in _one_line_error(result)
    assert (run_dir / "config.toml").read_text() == before


def test_checkpoint_evaluations_reach_tensorboard(tiny_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    result = run_cli(
        "train",
        str(tiny_config(steps=10, checkpoint_every=5)),
        "--out",
        str(run_dir),
        "--set",
        "eval.checkpoint_samples=8",
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/oracle_ood")] == [5, 10]
    assert all(0 <= e.value <= 1 for e in events.Scalars("eval/oracle_id"))


def test_results_check_fails_on_a_stale_page_and_the_command_mends_it(tmp_path, capsys):
    from looplab.cli import main

    shutil.copytree(Path(__file__).resolve().parents[2] / "docs" / "results", tmp_path / "results")
    page = tmp_path / "results" / "stopping-study.md"
    fresh = page.read_text()
    page.write_text(fresh.replace("| dyck1 | fixed | 8 |", "| dyck1 | fixed | 9 |"))
    assert main(["results", "--dir", str(tmp_path / "results"), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["results", "--dir", str(tmp_path / "results")]) == 0
    assert page.read_text() == fresh


def test_train_says_what_it_starts_and_when_nothing_is_left(tmp_path):
    config, run_dir = train_tiny_run(tmp_path, 4, 2)
    again = run_cli("train", str(config), "--out", str(run_dir))  # progress on, off a terminal
    assert again.returncode == 0
    assert f"train: {run_dir}, " in again.stdout and "parameters, cpu, 1 threads" in again.stdout
    assert "already trained to step 4 of 4, nothing to train" in again.stdout
    assert run_cli("--version").stdout.startswith("looplab ")


def test_eval_scaling_writes_its_curves_and_figures_to_tensorboard(trained_run, tmp_path):
    """The curves land with their own x as the step (K or n) and equal the files; figures land as images."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, trained = trained_run
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
    result = run_cli("eval", str(run_dir), "--scaling")  # the run's own settings: written to RUN/eval
    assert result.returncode == 0, result.stderr
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    curve = pd.read_csv(run_dir / "eval" / "scaling.csv")
    logged = events.Scalars("scaling/accuracy")
    assert [e.step for e in logged] == list(curve.loops) == list(range(1, 11))  # eval.max_loops = 10
    assert [e.value for e in logged] == pytest.approx(list(curve.accuracy))
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    oracle = events.Scalars("eval_by_length/oracle")
    assert [e.step for e in oracle] == sorted(int(n) for n in summary["per_length"])
    assert {"eval_by_loops/accuracy_id", "eval_by_loops/accuracy_ood"} <= set(events.Tags()["scalars"])
    images = events.Tags()["images"]
    assert "figures/scaling" in images
    picture = events.Images("figures/scaling")[0]
    assert picture.width > 100 and picture.height > 100


def test_train_checks_its_config_once(tiny_config, tmp_path, monkeypatch):
    """One ``looplab train`` checks its config once, the schema's checks and the registries' alike, and passes
    the checked config down (to the trainer, the experiment it builds); a resume too (it reads the run dir's
    saved config to compare it, which is that file's own check)."""
    import looplab.config.load as load
    import looplab.experiment as experiment
    from looplab.cli import main

    calls = Counter()

    def counting(name, original):
        def counted(*args):
            calls[name] += 1
            return original(*args)

        return counted

    # counted inside the checks (looked up at each call), whatever name a caller imported them by
    monkeypatch.setattr(load, "validate", counting("validate", load.validate))
    monkeypatch.setattr(
        experiment, "check_deep_supervision", counting("check_config", experiment.check_deep_supervision)
    )
    config, run_dir = tiny_config(steps=2, checkpoint_every=2), tmp_path / "run"
    assert main(["train", str(config), "--out", str(run_dir), "--no-progress"]) == 0
    assert calls == {"validate": 1, "check_config": 1}
    calls.clear()
    assert main(["train", str(config), "--out", str(run_dir), "--no-progress"]) == 0
    assert calls == {"validate": 2, "check_config": 1}
