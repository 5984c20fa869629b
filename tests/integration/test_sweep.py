"""Sweeps: grid expansion, skip and resume, SIGKILL at a random moment, the results table."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch

from looplab.errors import LooplabError
from looplab.sweep import load_sweep
from tests.conftest import TINY, run_cli

SWEEP = """
[sweep]
configs = ["tiny.toml"]
seeds = [0, 1]
set = ["train.steps=150", "train.checkpoint_every=25"]

[grid]
"schedule.name" = ["window", "matched"]
"""
VOLATILE = ["wall_s"]  # the only column allowed to differ between two sweeps of the same points


def write_sweep(root: Path, text: str = SWEEP) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tiny.toml").write_text(TINY.format(steps=20, checkpoint_every=10))
    path = root / "sweep.toml"
    path.write_text(text)
    return path


def sweep_cli(sweep_file: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli("sweep", str(sweep_file), "--out", str(out), "--no-progress", *args)


def test_expansion_names_and_hashes(tmp_path):
    spec = load_sweep(write_sweep(tmp_path))
    points = spec.points()
    assert len(points) == 4
    assert sorted({p.variant for p in points}) == ["tiny+schedule.name=matched", "tiny+schedule.name=window"]
    assert len({p.run_id for p in points}) == 4
    assert all("threads = 1" in p.config_toml for p in points)
    assert [p.run_id for p in load_sweep(tmp_path / "sweep.toml").points()] == [p.run_id for p in points]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[sweep]\nconfigs = ['tiny.toml']\nworkers = 2\n", "unknown key in [sweep] 'workers'; valid choices"),
        ("[sweep]\nconfigs = ['nothing-*.toml']\n", "nothing matches 'nothing-*.toml'"),
        ("[sweep]\nconfigs = ['tiny.toml']\nseeds = 0\n", "seeds must be a count >= 1"),
        ("[sweep]\nconfigs = ['tiny.toml']\nset = ['model.colour=3']\n", "unknown key in [model] 'colour'"),
        ("[sweeps]\n", "unknown sweep file section 'sweeps'; valid choices: grid, sweep"),
        ("[sweep]\nconfigs = ['tiny.toml']\nscaling = 'no'\n", "sweep.scaling must be bool, got 'no'"),
        ("[sweep]\nconfigs = ['tiny.toml']\nevaluate = 0\n", "sweep.evaluate must be bool, got 0"),
        ("[sweep]\nconfigs = ['tiny.toml']\nanalyze = 1\n", "sweep.analyze must be bool, got 1"),
        ("[sweep]\nconfigs = ['tiny.toml']\nanalyze_samples = 0\n", "sweep.analyze_samples must be in [1, inf), got 0"),
        ("[sweep]\nconfigs = ['tiny.toml']\nanalyze_loops = true\n", "sweep.analyze_loops must be int, got True"),
        (
            "[sweep]\nconfigs = ['tiny.toml']\nanalyze = true\nanalyze_metrics = ['colsum', 'sinks']\n",
            "unknown analysis metric 'sinks'; valid choices: attention, colsum",
        ),
        (
            "[sweep]\nconfigs = ['tiny.toml']\nanalyze_metrics = 'colsum'\n",
            "sweep.analyze_metrics must be a list of str",
        ),
        ("[sweep]\nconfigs = ['tiny.toml']\nanalyze_plots = 'no'\n", "sweep.analyze_plots must be bool, got 'no'"),
        ("[sweep]\nconfigs = ['tiny.toml']\npretrain = 'none.toml'\n", "[sweep] pretrain must name a config file"),
        ("[sweep]\nconfigs = ['tiny.toml']\npretrain = 3\n", "[sweep] pretrain must name a config file"),
    ],
)
def test_bad_sweep_files_name_the_problem(tmp_path, text, message):
    with pytest.raises(LooplabError, match=re.escape(message)):
        load_sweep(write_sweep(tmp_path, text))


def test_bad_sweep_cli_is_one_line_exit_2(tmp_path):
    result = sweep_cli(write_sweep(tmp_path, "[sweep]\nconfigs = ['tiny.toml']\nseeds = 'many'\n"), tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "seeds must be" in result.stderr
    assert not (tmp_path / "out").exists()


def _results(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "results.parquet").drop(columns=VOLATILE).sort_values("run_id").reset_index(drop=True)


def test_sigkill_then_rerun_equals_uninterrupted(tmp_path):
    sweep_file = write_sweep(tmp_path)
    reference = tmp_path / "reference"
    assert sweep_cli(sweep_file, reference, "--workers", "2").returncode == 0
    expected = _results(reference)
    assert len(expected) == 4 and expected["oracle_id"].notna().all()

    out = tmp_path / "killed"
    delay = random.uniform(0.0, 1.0)
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "looplab",
            "sweep",
            str(sweep_file),
            "--out",
            str(out),
            "--workers",
            "2",
            "--no-progress",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not list(out.glob("runs/*/checkpoints/step_*")) and time.monotonic() < deadline:  # training has begun
        time.sleep(0.05)
    time.sleep(delay)
    os.killpg(sweep.pid, signal.SIGKILL)
    sweep.wait()
    finished_before = sorted(p.parent.name for p in out.glob("runs/*/result.json"))
    assert len(finished_before) < 4, f"the kill after {delay:.2f} s came too late to interrupt anything"

    rerun = sweep_cli(sweep_file, out, "--workers", "2")
    assert rerun.returncode == 0, rerun.stderr
    got = _results(out)
    pd.testing.assert_frame_equal(got, expected, check_exact=True, obj=f"results after a SIGKILL at +{delay:.2f} s")
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(got["run_id"])
    for name in finished_before:  # finished points were skipped, not re-run
        assert json.loads((out / "runs" / name / "result.json").read_text())["status"] == "done"


def test_rerun_of_a_finished_sweep_skips_everything(tmp_path):
    sweep_file = write_sweep(tmp_path, SWEEP.replace("seeds = [0, 1]", "seeds = [0]"))
    out = tmp_path / "out"
    first = run_cli("sweep", str(sweep_file), "--out", str(out))  # progress on, stderr not a terminal
    assert first.returncode == 0
    # off a terminal the progress line counts the finished runs (a disabled bar would read 0)
    assert re.search(r"^sweep: 2/2 \(100%\), last: \w+ \(done\)", first.stdout, re.M), first.stdout
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/**/*") if p.is_file()}
    again = sweep_cli(sweep_file, out)
    assert again.returncode == 0 and "already done, all 2 runs finished earlier" in again.stdout
    assert "next: looplab report" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    frame = pd.read_parquet(out / "results.parquet")
    for column in (
        "run_id",
        "variant",
        "task.name",
        "schedule.name",
        "run.seed",
        "oracle_ood",
        "front90",
        "training_cost.block_evals",
        "per_length.8.oracle",
    ):
        assert column in frame.columns, column


def test_analysis_only_sweep_of_untrained_models(tmp_path):
    """train.steps = 0 and evaluate = false: each point is its seeded initialisation, analysed only."""
    text = (
        "[sweep]\nconfigs = ['tiny.toml']\nseeds = [0, 1]\nset = ['train.steps=0', 'model.core_layers=2']\n"
        "evaluate = false\nanalyze = true\nanalyze_loops = 6\nanalyze_samples = 2\nmlp_ablation = false\n"
        "analyze_metrics = ['fixed_points', 'massive']\nanalyze_plots = false\n"
    )
    result = sweep_cli(write_sweep(tmp_path, text), tmp_path / "out")
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(frame) == 2 and set(frame["status"]) == {"done"}
    assert "oracle_ood" not in frame.columns
    assert (frame["analysis.steps_trained"] == 0).all() and (frame["analysis.samples"] == 2).all()
    assert frame["analysis.fixed_point_cross_cos_min"].nunique() == 2  # the seed decides the weights
    assert "analysis.colsum.mean" not in frame.columns and "analysis.massive_ratio_max" in frame.columns
    for run_dir in frame["run_dir"]:
        assert not (tmp_path / "out" / run_dir / "eval").exists()
        written = {p.name for p in (tmp_path / "out" / run_dir / "analysis" / "mechanistic").iterdir()}
        assert written == {"summary.json", "fixed_points.csv", "layer_cosines.csv", "massive.csv"}


def test_tensorboard_names_sweep_runs_and_holds_eval_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep_file = write_sweep(tmp_path, SWEEP.replace("seeds = [0, 1]", "seeds = [0]"))
    out = tmp_path / "out"
    assert sweep_cli(sweep_file, out).returncode == 0
    links = sorted(p.name for p in (out / "tensorboard").iterdir())
    assert links and all(re.fullmatch(r"binary_addition-.+-seed0", name) for name in links), links
    events = EventAccumulator(str(out / "tensorboard" / links[0]))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "train/loss" in scalars and "eval/oracle_ood" in scalars


def test_sigterm_stops_the_workers_after_a_checkpoint_and_a_rerun_resumes_exactly(tmp_path):
    """SIGTERM to the sweep (what SLURM sends before a kill): no new point starts, the running ones
    checkpoint at their next step, the sweep exits 143 with one line, and a re-run finishes them as an
    uninterrupted sweep would."""
    text = (
        "[sweep]\nconfigs = ['tiny.toml']\nseeds = [0, 1, 2]\n"
        "set = ['train.steps=400', 'train.checkpoint_every=1000', 'train.log_every=1']\n"
    )
    sweep_file = write_sweep(tmp_path, text)
    straight = tmp_path / "straight"
    assert sweep_cli(sweep_file, straight, "--workers", "2").returncode == 0

    out = tmp_path / "stopped"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "looplab", "sweep", str(sweep_file), "--out", str(out), "--workers", "2"]
    process = subprocess.Popen(command + ["--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while sum(1 for log in out.glob("runs/*/log.jsonl") if len(log.read_text().splitlines()) >= 20) < 2:
        assert process.poll() is None and time.time() < deadline, "the sweep ended before it could be stopped"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    err = process.communicate(timeout=120)[1].decode()
    assert process.returncode == 143, err
    (line,) = err.strip().splitlines()
    # the third point never starts, or (already handed to a worker) stops at its first step
    stopped = re.match(r"looplab: stopped by SIGTERM: 0 of 3 runs finished, ([23]) stopped after a checkpoint", line)
    assert stopped, line
    checkpoints = sorted(out.glob("runs/*/checkpoints/step_*"))
    assert len(checkpoints) == int(stopped[1]) and all(int(p.name.split("_")[1]) < 400 for p in checkpoints)
    assert not list(out.glob("runs/*/result.json"))

    assert sweep_cli(sweep_file, out, "--workers", "2").returncode == 0
    for run in sorted((straight / "runs").iterdir()):
        final = run / "checkpoints" / "step_0000400" / "model.safetensors"
        assert final.read_bytes() == (out / "runs" / run.name / final.relative_to(run)).read_bytes(), run.name


PRETRAIN_SWEEP = """
[sweep]
configs = ["tiny.toml"]
seeds = [0, 1]
set = ["train.steps=10"]
pretrain = "tiny.toml"

[grid]
"model.injection" = ["add", "none"]
"""


def test_a_pretrain_is_shared_by_the_points_of_its_seed_and_model_shape(tmp_path):
    points = load_sweep(write_sweep(tmp_path, PRETRAIN_SWEEP)).points()
    pretrained, tuned = points[:4], points[4:]
    assert all(p.after is None for p in pretrained) and all(p.after for p in tuned)
    assert sorted(p.variant for p in pretrained) == ["tiny", "tiny", *["tiny+model.injection=none"] * 2]
    assert len({p.after for p in tuned}) == 4  # one per (seed, injection)
    ids = {p.run_id for p in pretrained}
    for point in tuned:
        assert f'init_from = "runs/{point.after}"' in point.config_toml and point.after in ids
        base = next(p for p in pretrained if p.run_id == point.after)
        config, its = (tomllib.loads(p.config_toml) for p in (point, base))
        assert config["model"] == its["model"] and config["run"]["seed"] == its["run"]["seed"]
        assert its["train"]["steps"] == 20  # the pretrain config's own, not the sweep's `set`


def test_a_fine_tune_starts_from_its_pretrained_weights(tmp_path):
    """With no steps of its own, a fine-tune is its pretrained model: the same weights and the same accuracy."""
    from safetensors.torch import load_file

    text = PRETRAIN_SWEEP.replace('"train.steps=10"', '"train.steps=0"').replace("seeds = [0, 1]", "seeds = [0]")
    out = tmp_path / "out"
    result = sweep_cli(write_sweep(tmp_path, text.replace('"add", "none"', '"add"')), out, "--workers", "2")
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(out / "results.parquet").set_index("run_id")
    tuned = frame[frame["train.init_from"] != ""]
    assert len(frame) == 2 and len(tuned) == 1
    source = tuned["train.init_from"].iloc[0]
    assert source.startswith("runs/") and (out / source / "result.json").is_file()

    def weights(run: Path, step: int) -> dict:
        return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")

    mine, pretrained, halfway = (
        weights(out / "runs" / tuned.index[0], 0),
        weights(out / source, 20),
        weights(out / source, 10),
    )
    assert mine.keys() == pretrained.keys()
    assert all(torch.equal(mine[k], pretrained[k]) for k in mine)
    assert not all(torch.equal(mine[k], halfway[k]) for k in mine)  # the pretrain's last weights, not any
    accuracy = [c for c in frame.columns if c.startswith("per_length.") and c.endswith(".oracle")]
    pd.testing.assert_series_equal(
        frame.loc[tuned.index[0], accuracy], frame.loc[source.removeprefix("runs/"), accuracy], check_names=False
    )
