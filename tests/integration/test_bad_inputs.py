"""Bad inputs and faults, table-driven: one line on stderr, the right exit code, no traceback,
nothing written by a refused command, and no file of an existing run dir touched.

Each case runs ``looplab.cli.main`` in this process (the same code path as the
console script, minus the interpreter start-up); a few that need a real process
are at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from looplab.cli import main
from looplab.io import exclusive_lock
from tests.conftest import TINY, run_cli, train_tiny_run

SWEEP = "[sweep]\nconfigs = ['tiny.toml']\nseeds = [0]\nset = ['train.steps=2']\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained run dir, its config, and files of every bad kind, made once for all cases."""
    root = tmp_path_factory.mktemp("bad")
    config, run_dir = train_tiny_run(root, 4, 2)
    (root / "not_utf8.toml").write_bytes(b"\xff\xfe[task]\n")
    (root / "broken.toml").write_text("[task\nname = 1\n")
    (root / "a_file").write_text("not a directory")
    (root / "bom.toml").write_bytes(b"\xef\xbb\xbf[task]\nname = 'copy'\n")
    (root / "exits.py").write_text("import sys\n\nsys.exit(0)\n")  # a plugin that ends the command on import
    (root / "latin1.py").write_bytes(b"# caf\xe9\nX = 1\n")  # Python imports it: the bad byte is in a comment
    no_config = root / "no_config"
    no_config.mkdir()
    for name, text in {"not_utf8_run": b"\xff\xfe[task]\n", "bad_value_run": b"[model]\nd_model = 'wide'\n"}.items():
        (root / name).mkdir()
        (root / name / "config.toml").write_bytes(text)
    for name, text in {
        "sweep.toml": SWEEP,
        "other_sweep.toml": SWEEP.replace("seeds = [0]", "seeds = [1]"),
        "sweep_bool.toml": SWEEP + "scaling = 'no'\n",
        "sweep_key.toml": SWEEP + "workers = 3\n",
    }.items():
        (root / name).write_text(text)
    sweep_dir = root / "sweep_dir"
    assert main(["sweep", str(root / "sweep.toml"), "--out", str(sweep_dir), "--no-progress"]) == 0
    lm_run = root / "lm_run"  # a language-modelling run with reasoning problems, one step trained
    lm_sets = ["task.name=kjv_arithmetic", "task.train_max=4", "task.eval_lengths=[2,5]", "model.causal=true"]
    lm_sets += ["train.steps=1", "model.max_len=64"]
    assert main(["train", str(config), "--out", str(lm_run), "--no-progress", *(f"--set={s}" for s in lm_sets)]) == 0
    maze_run = root / "maze_run"  # a task whose sizes are bounded (grids of side 2..32), one step trained
    maze_sets = ["task.name=maze", "task.train_min=2", "task.train_max=3", "task.eval_lengths=[3]", "train.steps=1"]
    assert (
        main(["train", str(config), "--out", str(maze_run), "--no-progress", *(f"--set={s}" for s in maze_sets)]) == 0
    )
    _damaged_copies(root, run_dir, sweep_dir)
    return {"root": root, "cfg": config, "run": run_dir, "sweep_dir": sweep_dir, "lm_run": lm_run, "maze_run": maze_run}


def _damaged_copies(root: Path, run_dir: Path, sweep_dir: Path) -> None:
    """Copies of the run and the sweep dir, each with one file damaged, and config files whose content is bad:
    every refusal must name the file at fault."""
    import pandas as pd
    from safetensors.torch import load_file, save_file

    (root / "empty.toml").write_text("")
    (root / "stepz.toml").write_text("[train]\nstepz = 3\n")
    (root / "stepz_sweep.toml").write_text(SWEEP.replace("tiny.toml", "stepz.toml"))

    def resumable(run: Path) -> Path:  # the latest checkpoint gone: train resumes from the one before
        shutil.rmtree(max((run / "checkpoints").iterdir()))
        return max((run / "checkpoints").iterdir())

    def int_weights(run: Path) -> None:
        path = max((run / "checkpoints").iterdir()) / "model.safetensors"
        tensors = load_file(path)
        save_file({name: t.long() if "bias" in name else t for name, t in tensors.items()}, path)

    def log_folder(run: Path) -> None:
        resumable(run)
        (run / "log.jsonl").unlink()
        (run / "log.jsonl").mkdir()

    runs = {
        "empty_config_run": lambda run: (run / "config.toml").write_text(""),
        "bad_value_config_run": lambda run: (run / "config.toml").write_text(
            (run / "config.toml").read_text().replace("t_max = 7", "t_max = -3")
        ),
        "int_weights_run": int_weights,
        "optimizer_list_run": lambda run: (resumable(run) / "optimizer.json").write_text("[]"),
        "log_folder_run": log_folder,
    }
    for name, damage in runs.items():
        shutil.copytree(run_dir, root / name)
        damage(root / name)

    def table_without(name: str, column: str):
        def damage(sweep: Path) -> None:
            path = next(sweep.rglob(name))
            pd.read_parquet(path).drop(columns=[column]).to_parquet(path, index=False)

        return damage

    def sweep_file_folder(sweep: Path) -> None:
        (sweep / "sweep.toml").unlink()
        (sweep / "sweep.toml").mkdir()

    sweeps = {
        "summary_sweep": lambda sweep: next(sweep.rglob("eval/summary.json")).write_text("{ cut off"),
        "sweep_file_sweep": sweep_file_folder,
        "no_seed_sweep": table_without("results.parquet", "run.seed"),
        "no_loops_sweep": table_without("grid.parquet", "loops"),
    }
    for name, damage in sweeps.items():
        shutil.copytree(sweep_dir, root / name, symlinks=True)
        damage(root / name)


#: the world's dirs no refused command may touch
WORLD_RUNS = ("run", "sweep_dir", "lm_run", "maze_run")


def snapshot(directory: Path) -> dict[str, str]:
    """Content hash of every file under ``directory`` (the lock file aside: it holds the last pid)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


CASES = [
    # ---- config files and overrides
    ("train {root}/missing.toml --out {new}", 2, "config file not found"),
    ("train {cfg} --out {root}/a_file/run", 2, "cannot make {root}/a_file/run: {root}/a_file is a file, not a folder"),
    ("train {root} --out {new}", 2, "is a directory, not a TOML file"),
    ("train {root}/not_utf8.toml --out {new}", 2, "is not UTF-8 text"),
    ("train {root}/broken.toml --out {new}", 2, "is not valid TOML"),
    ("train {cfg} --set model.colour=3 --out {new}", 2, "unknown key in [model] 'colour'"),
    ("train {cfg} --set colour.x=3 --out {new}", 2, "unknown config section 'colour'"),
    ("train {cfg} --set model --out {new}", 2, "must look like section.key=value"),
    ("train {cfg} --set model.d_model=wide --out {new}", 2, "model.d_model must be int"),
    ("train {cfg} --set model.norm=batchnorm --out {new}", 2, "valid choices: layernorm, rmsnorm, simplenorm"),
    ("train {cfg} --set model.inject_init=eye --out {new}", 2, "valid choices: input, mix, random, state, sum"),
    ("train {cfg} --set model.init_std=0 --out {new}", 2, "model.init_std must be in (0, inf), got 0.0"),
    ("train {cfg} --set train.grad_clip=-1 --out {new}", 2, "train.grad_clip must be in (0, inf)"),
    ("train {cfg} --set train.min_lr_ratio=-5 --out {new}", 2, "train.min_lr_ratio must be in [0, 1]"),
    ("train {cfg} --set train.beta1=1.5 --out {new}", 2, "train.beta1 must be in [0, 1)"),
    ("train {cfg} --set train.beta2=1 --out {new}", 2, "train.beta2 must be in [0, 1)"),
    ("train {cfg} --set train.lr=inf --out {new}", 2, "train.lr must be in (0, inf)"),
    ("train {cfg} --set train.lr=nan --out {new}", 2, "train.lr must be in (0, inf)"),
    (
        "train {cfg} --set train.steps=-1 --out {new}",
        2,
        "train.steps must be in [0, inf), got -1 (0: keep the initialisation)",
    ),
    ("train {cfg} --set model.rope_base=0 --out {new}", 2, "model.rope_base must be in (0, inf)"),
    ("train {cfg} --set run.threads=-3 --out {new}", 2, "run.threads must be in [0, inf)"),
    ("train {cfg} --set model.noise_std=-1 --out {new}", 2, "model.noise_std must be in [0, inf)"),
    (
        "train {cfg} --set eval.fixed_exit=40 --out {new}",
        2,
        "eval.exits.fixed.depth (40) must be <= eval.max_loops (10)",
    ),
    (
        "train {cfg} --set eval.exits.fixed.depth=-1 --out {new}",
        2,
        "eval.exits.fixed.depth must be in [0, inf), got -1",
    ),
    ("train {cfg} --set eval.exits.nope.depth=1 --out {new}", 2, "unknown exit [eval.exits.NAME], NAME = 'nope'"),
    ("train {cfg} --set generate.exits.kl.eps=0 --out {new}", 2, "generate.exits.kl.eps must be in (0, inf), got 0"),
    (
        "train {cfg} --set generate.exits.kl.epsilon=1 --out {new}",
        2,
        "unknown key in [generate.exits.kl] 'epsilon'; valid choices: direction, eps",
    ),
    ("train {cfg} --set generate.exits.nope.x=1 --out {new}", 2, "unknown generation exit [generate.exits.NAME]"),
    (
        "train {cfg} --set eval.fixed_exit=4 --set eval.exits.fixed.depth=5 --out {new}",
        2,
        "eval.fixed_exit is the earlier name",
    ),
    ("train {cfg} --set eval.flip_from=0 --out {new}", 2, "eval.flip_from must be in [1, inf), got 0"),
    ("train {cfg} --set eval.flip_from=10 --out {new}", 2, "eval.flip_from (10) must be <= eval.max_loops - 1 (9)"),
    ("train {cfg} --set model.d_model=1000000 --set model.n_heads=2 --out {new}", 2, "needs an estimated"),
    ("train {cfg} --set train.batch_size=1000000000 --out {new}", 2, "needs an estimated"),
    ("train {cfg} --set run.device=cuda --out {new}", 2, "no CUDA device; valid choices: cpu"),
    ("train {cfg} --set run.device=cuda:x --out {new}", 2, "is not 'cpu', 'cuda' or 'cuda:N'"),
    ("train {cfg} --set run.device=tpu --out {new}", 2, "run.device must be 'cpu' or 'cuda[:N]'"),
    ("train {cfg} --set model.d_model=31 --out {new}", 2, "must be a positive multiple of model.n_heads"),
    ("train {cfg} --set stability.jsrr.rows=-1 --out {new}", 2, "stability.jsrr.rows must be in [0, inf), got -1"),
    (
        "train {cfg} --set model.attention_window=-2 --out {new}",
        2,
        "model.attention_window must be in [0, inf), got -2 (0: every position)",
    ),
    ("train {cfg} --set task.alphabet=1000000000000 --out {new}", 2, "task.alphabet must be in [2, 65536]"),
    (
        "train {cfg} --set task.name=kjv_arithmetic --set task.train_max=7 --set model.causal=true --out {new}",
        2,
        "task.train_max must be <= 6 for task 'kjv_arithmetic', got 7",
    ),
    (
        "train {cfg} --set task.name=chain_arithmetic --set task.eval_lengths=[4,30] --out {new}",
        2,
        "task.eval_lengths must be <= 25 for task 'chain_arithmetic', got 30",
    ),
    # ---- contradictions between keys
    (
        "train {cfg} --set schedule.name=fixed_window --set schedule.depth=10 --set schedule.t_max=3 --out {new}",
        2,
        "it never trains at its own depth; set t_max >= 10",
    ),
    ("train {cfg} --set schedule.t_max=2 --out {new}", 2, "schedule.t_max = 2, below T(train_max) = 7"),
    (
        "train {cfg} --set schedule.depht=3 --out {new}",
        2,
        "unknown key in [schedule] for the window schedule 'depht'; valid choices: t_max, window",
    ),
    (
        "train {cfg} --set stability.jsr.weight=0.1 --out {new}",
        2,
        "unknown regulariser [stability.NAME], NAME = 'jsr'; valid choices: jsrr",
    ),
    (
        "train {cfg} --set model.placement=sideways --out {new}",
        2,
        "valid choices: post, post_sandwich, pre, pre_sandwich",
    ),
    ("train {cfg} --set run.plugins=['no_such_plugin'] --out {new}", 2, "plugin module 'no_such_plugin' not found"),
    ("train {cfg} --set run.plugins=['{root}/exits.py'] --out {new}", 2, "exits.py called sys.exit(0) on import"),
    ("train {cfg} --set run.plugins=['{root}/latin1.py'] --out {new}", 2, "latin1.py is not UTF-8 text (byte 5)"),
    (
        "train {cfg} --set schedule.name=multi_depth --set schedule.t_max=3 --out {new}",
        2,
        "schedule.t_max = 3, below T(train_max) = 7",
    ),
    (
        "train {cfg} --set schedule.name=fixed --set schedule.depth=40 --out {new}",
        2,
        "reads answers at up to 40 loops, beyond eval.max_loops = 10",
    ),
    (
        "train {cfg} --set schedule.name=rl_halting --set schedule.t_max=50 --out {new}",
        2,
        "reads answers at up to 50 loops, beyond eval.max_loops = 10",
    ),
    (
        "train {cfg} --set schedule.name=rl_halting --set train.segment_loops=2 --out {new}",
        2,
        "train.segment_loops = 2 (deep supervision) does not apply to the rl_halting schedule",
    ),
    (
        "train {cfg} --set schedule.name=q_halt --set schedule.t_max=10 --set train.segment_loops=3 --out {new}",
        2,
        "the q_halt schedule's schedule.t_max = 10 must be a whole number of segments of train.segment_loops = 3",
    ),
    (
        "train recursive-small/maze-ds_fixed --set schedule.depth=7 --out {new}",
        2,
        "the fixed schedule's deepest training depth 7 must be a whole number of segments of train.segment_loops = 2",
    ),
    (
        "train recursive-small/maze-ds_fixed --set schedule.depth=4 --set train.segment_loops=8 --out {new}",
        2,
        "train.segment_loops = 8 is longer than the fixed schedule's deepest training depth 4: "
        "one segment would hold the whole unroll; use train.segment_loops in 1..4",
    ),
    (
        "train {cfg} --set train.segment_loops=2 --set schedule.t_max=9 --set schedule.window=2 --out {new}",
        2,
        "the window schedule's deepest training depth 9 must be a whole number of segments",
    ),
    (
        "train {cfg} --set eval.checkpoint_samples=8 --set eval.max_loops=1000000000 --out {new}",
        2,
        "the checkpoint evaluations (8 samples x 1000000000 loops x 3 lengths) needs an estimated",
    ),
    ("train {cfg} --set task.name=kjv --out {new}", 2, "it needs model.causal = true"),
    ("pool sudoku4 --sizes 30 --count 1 --out {new}", 2, "--sizes must be 1..11 for sudoku4, got [30]"),
    ("config show {root}/bom.toml", 2, "starts with a UTF-8 byte-order mark; save it as UTF-8 without BOM"),
    ("eval {root}/a_file", 2, "a_file is a file, not a run dir"),
    ("pool sudoku4 --sizes 3 --count 0 --out {new}", 2, "--count must be >= 1, got 0"),
    ("pool sudoku4 --sizes 3,5 --count 10000000000 --out {new}", 2, "a pool of 10000000000 x 2 instances needs"),
    ("pool nope --sizes 3 --count 1 --out {new}", 2, "unknown task 'nope'; valid choices: binary_addition"),
    ("pool sudoku4 --sizes 3 --count 1 --out {root}", 2, "must be a file path in an existing directory"),
    ("train {cfg} --set task.pool={root}/none.safetensors --out {new}", 2, "none.safetensors is not a file"),
    (
        "train {cfg} --set model.injection=none --set model.init_state=zeros --out {new}",
        2,
        "model.init_state = 'zeros' has no effect with injection = 'none'",
    ),
    (
        "train {cfg} --set model.positional=learned --set model.max_len=8 --out {new}",
        2,
        "learned positions reach model.max_len = 8, but a size-8 instance",
    ),
    ("eval {run} --lm-loops 4 --scaling", 2, "--scaling belong to the exact-match evaluation"),
    ("eval {run} --lm-loops 4 --lengths 4 --max-loops 3", 2, "--lengths, --max-loops belong to"),
    ("eval {run} --lm-loops 0", 2, "--lm-loops must be >= 1, got 0"),
    ("eval {lm_run} --lm-loops 1000000000", 2, "x 1000000000 loops x 2 sizes needs an estimated"),
    ("sweep {root}/sweep.toml --out {new} --address 127.0.0.1:1", 2, "it needs --backend ray"),
    ("generate {run} --prompt x", 2, "whose tokens are not text"),
    ("train {cfg} --set train.init_from={root}/missing --out {new}", 2, "run dir not found"),
    ("train {cfg} --set train.init_from={run} --set model.d_model=16 --out {new}", 2, "model.d_model differ"),
    ("train {cfg} --set train.init_from={run} --set task.name=copy --out {new}", 2, "reads a vocabulary of"),
    # ---- output paths
    ("train {cfg} --out {sweep_dir}", 2, "is a sweep dir (it holds sweep.toml)"),
    ("train {cfg} --out {root}", 2, "and is not a run dir; use a new or empty dir"),
    ("sweep {root}/sweep.toml --out {run}", 2, "is a run dir (it holds config.toml)"),
    ("analyze {run} --loops 2 --out {run}", 2, "is a run dir (it holds config.toml)"),
    ("analyze spectral {run} --loops 2 --out {sweep_dir}", 2, "is a sweep dir (it holds sweep.toml)"),
    ("train {cfg} --out {root}/a_file", 2, "a_file"),
    ("train {cfg} --out /sys/looplab-test-run", 2, "/sys/looplab-test-run"),
    ("train {cfg} --out ", 2, "out must not be empty"),
    ("train {cfg} --set train.lr=0.5 --out {run}", 2, "holds a different config (differs in train.lr)"),
    ("config show {root}/missing.toml", 2, "neither a file nor a bundled preset"),
    ("config show no-such-preset", 2, "presets: demo, generation/…, mechanistic/…"),
    # ---- evaluation
    ("eval {root}/missing", 2, "run dir not found"),
    ("eval {root}/no_config", 2, "is not a run dir (no config.toml)"),
    ("eval {run} --max-loops 0", 2, "--max-loops must be >= 1"),
    ("eval {run} --samples 0", 2, "--samples must be >= 1"),
    ("eval {run} --max-loops 1000000000", 2, "needs an estimated"),
    ("eval {run} --samples 1000000000", 2, "needs an estimated"),
    ("eval {run} --lengths 4,x", 2, "expected comma-separated integers"),
    ("eval {run} --lengths 0", 2, "--lengths must be a non-empty list of integers >= 1"),
    ("eval {maze_run} --lengths 500", 2, "--lengths must be <= 32 for task 'maze', got 500 (valid: 2..32)"),
    ("eval {maze_run} --lengths 1,3", 2, "--lengths must be >= 2 for task 'maze', got 1 (valid: 2..32)"),
    ("eval {root}/not_utf8_run", 2, "not_utf8_run/config.toml is not UTF-8 text"),
    ("eval {root}/bad_value_run", 2, "bad_value_run/config.toml: model.d_model must be int, got 'wide'"),
    ("eval {run} --lm-loops 4 --samples 0", 2, "--samples must be >= 1"),
    ("eval {run} --colour", 2, "unrecognized arguments: --colour"),
    ("eval", 2, "the following arguments are required: run_dir"),
    # ---- analysis
    ("analyze {root}/missing", 2, "run dir not found"),
    ("analyze {run} --loops 0", 2, "--loops and --samples must be >= 1"),
    ("analyze {run} --loops 100000000", 2, "an analysis trace of 8 samples x 100000000 loops needs an estimated"),
    ("analyze {run} --loops 2 --zero-mlp core9", 2, "unknown MLP to zero 'core9'; valid choices: core0"),
    ("analyze {run} --loops 2 --metrics colsum,sinks", 2, "unknown analysis metric 'sinks'; valid choices: attention"),
    ("analyze {cfg} --loops 4", 2, "needs --out DIR"),
    ("analyze {run} --set model.d_model=8", 2, "--set applies to a config file"),
    ("analyze spectral {run} --iters 0", 2, "--iters must be >= 1"),
    ("analyze pca {run} --sample -1", 2, "--sample must be >= 0"),
    ("analyze spectral {run} --length 0", 2, "--length, --loops and --samples must be >= 1"),
    ("analyze spectral {maze_run} --length 500", 2, "--length must be <= 32 for task 'maze', got 500 (valid: 2..32)"),
    ("analyze pca {maze_run} --length 1", 2, "--length must be >= 2 for task 'maze', got 1 (valid: 2..32)"),
    ("analyze spectral {run} --length 1000000", 2, "a spectral analysis of 4 sample(s) of size 1000000 x 10 loops"),
    ("analyze spectral {run} --loops 1000000000000", 2, "x 1000000000000 loops needs an estimated"),
    ("analyze spectral {run} --samples 1000000000", 2, "a spectral analysis of 1000000000 sample(s)"),
    ("analyze pca {run} --loops 1000000000000", 2, "a pca analysis of 1 sample(s) of size 6 x 1000000000000 loops"),
    ("analyze pca {run} --sample 1000000000", 2, "a pca analysis of 1000000001 sample(s)"),
    # ---- sweeps, reports, reproductions
    ("sweep {root}/missing.toml --out {new}", 2, "sweep file not found"),
    ("sweep {root}/sweep_bool.toml --out {new}", 2, "sweep.scaling must be bool, got 'no'"),
    ("sweep {root}/sweep_key.toml --out {new}", 2, "unknown key in [sweep] 'workers'"),
    ("sweep {root}/sweep.toml --out {new} --workers 0", 2, "--workers must be >= 1"),
    ("sweep {root}/sweep.toml --out {new} --backend slurm", 2, "invalid choice: 'slurm'"),
    ("sweep {root}/other_sweep.toml --out {sweep_dir}", 2, "holds a different sweep"),
    ("sweep {root}/sweep.toml --out {root}/a_file", 2, "is a file, not a sweep dir"),
    ("sweep {root}/sweep.toml --out {new} --backend ray --address 127.0.0.1:1", 2, "cannot reach the Ray cluster"),
    ("report {root}/missing", 2, "no results.parquet"),
    ("report {sweep_dir} --paper physics", 2, "unknown paper 'physics'; valid choices: mechanistic, recursive"),
    ("reproduce physics-small --out {new}", 2, "invalid choice: 'physics-small'"),
    ("results --dir {root}/missing", 2, "results folder not found: "),
    ("results --dir {new} --collect {root}/no_config", 2, "no run dirs under runs/"),
    ("frobnicate", 2, "invalid choice: 'frobnicate'"),
    # ---- a file's content at fault: the file is named
    ("train {root}/empty.toml --out {new}", 2, "config file {root}/empty.toml holds no settings"),
    ("train {root}/stepz.toml --out {new}", 2, "config file {root}/stepz.toml: unknown key in [train] 'stepz'"),
    (
        "config show {cfg} --set schedule.t_max=-3",
        2,
        "config file {cfg} with --set schedule.t_max=-3: schedule.t_max must be in [1, inf)",
    ),
    ("eval {root}/empty_config_run", 2, "{root}/empty_config_run/config.toml has no [task] table"),
    ("eval {root}/bad_value_config_run", 2, "{root}/bad_value_config_run/config.toml: schedule.t_max must be in"),
    (
        "eval {root}/int_weights_run",
        2,
        "model.safetensors does not match the model: core.0.attn.qkv.bias is stored as torch.int64",
    ),
    ("train {cfg} --out {root}/optimizer_list_run", 2, "optimizer.json is corrupt or mismatched: not a JSON object"),
    ("train {cfg} --out {root}/log_folder_run", 2, "{root}/log_folder_run/log.jsonl is not a file"),
    ("sweep {root}/sweep.toml --out {root}/summary_sweep", 2, "/eval/summary.json is not valid JSON"),
    ("sweep {root}/sweep.toml --out {root}/sweep_file_sweep", 2, "{root}/sweep_file_sweep/sweep.toml is not a file"),
    ("sweep {root}/stepz_sweep.toml --out {new}", 2, "sweep file {root}/stepz_sweep.toml: config file {root}/stepz"),
    ("report {root}/no_seed_sweep", 2, "no_seed_sweep/results.parquet lacks column(s) run.seed"),
    ("report {root}/no_loops_sweep", 2, "/eval/grid.parquet lacks column(s) loops"),
]


@pytest.mark.parametrize("template, code, message", CASES, ids=[c[0].split(" --out")[0] for c in CASES])
def test_bad_input_is_one_line_and_harmless(world, tmp_path, capsys, template, code, message):
    new = tmp_path / "new"
    args = template.format(new=new, **world).split(" ")  # "--out " ends in an empty argument
    before = {key: snapshot(world[key]) for key in WORLD_RUNS}
    assert main(args) == code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("looplab: error: "), err
    assert message.format(**world) in lines[0], lines[0]
    assert "Traceback" not in err
    assert not new.exists(), "a refused command wrote its output"
    assert {key: snapshot(world[key]) for key in WORLD_RUNS} == before


def test_the_table_covers_at_least_forty_cases():
    assert len(CASES) >= 40


def test_corrupt_checkpoint_state_is_one_line(tmp_path, capsys):
    _, run_dir = train_tiny_run(tmp_path, 2, 2)
    (run_dir / "checkpoints" / "step_0000002" / "state.json").write_text("{}")
    assert main(["train", str(tmp_path / "tiny.toml"), "--out", str(run_dir), "--no-progress"]) == 2
    assert "has no integer 'step'" in capsys.readouterr().err


def test_a_checkpoint_train_refuses_is_refused_alike_by_every_command_that_loads_it(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    state = run / "checkpoints" / "step_0000004" / "state.json"
    state.write_text("garbage{")
    before = snapshot(run)
    expected = f"looplab: error: checkpoint state {state} is unreadable: Expecting value: line 1 column 1 (char 0)"
    for command in (
        ["train", str(world["cfg"]), "--out", str(run), "--no-progress"],
        ["train", str(world["cfg"]), "--set", f"train.init_from={run}", "--out", str(tmp_path / "new")],
        ["eval", str(run)],
        ["eval", str(run), "--lm-loops", "2"],
        ["analyze", str(run), "--loops", "2"],
        ["analyze", "spectral", str(run)],
        ["analyze", "pca", str(run)],
    ):
        assert main(command) == 2, command
        assert capsys.readouterr().err.strip().splitlines() == [expected], command
    assert snapshot(run) == before and not (tmp_path / "new").exists()


def test_a_checkpoint_whose_step_contradicts_its_folder_is_refused_and_kept(tmp_path, capsys):
    _, run_dir = train_tiny_run(tmp_path, 2, 2)
    state = run_dir / "checkpoints" / "step_0000002" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "step": -5}))
    before = snapshot(run_dir)
    assert main(["train", str(tmp_path / "tiny.toml"), "--out", str(run_dir), "--no-progress"]) == 2
    assert "its step -5 does not match its folder step_0000002" in capsys.readouterr().err
    assert snapshot(run_dir) == before


def test_malformed_log_lines_are_skipped_by_eval_and_train(tmp_path, capsys):
    _, run_dir = train_tiny_run(tmp_path, 4, 2)
    log = run_dir / "log.jsonl"
    good = log.read_bytes()
    log.write_bytes(good + b'[1, 2]\n{"step": "ten"}\n{"loss": 1.0}\n\xff\xfe garbage\n{"step": 4, "loss"')
    assert main(["eval", str(run_dir), "--samples", "8", "--max-loops", "4", "--lengths", "4"]) == 0
    summary = json.loads((run_dir / "eval" / "lengths4_loops4_samples8" / "summary.json").read_text())
    assert summary["training_cost"]["block_evals"] is not None
    assert main(["train", str(tmp_path / "tiny.toml"), "--set", "train.steps=6", "--out", str(run_dir)]) == 2
    assert "holds a different config" in capsys.readouterr().err  # refused for the config, not the log


def test_analysis_refuses_to_write_over_an_evaluation(world, tmp_path, capsys):
    (run,) = (world["sweep_dir"] / "runs").iterdir()
    eval_dir = run / "eval"
    before = snapshot(eval_dir)
    assert main(["analyze", str(run), "--loops", "2", "--out", str(eval_dir)]) == 2
    assert "is an evaluation dir (it holds grid.parquet)" in capsys.readouterr().err
    assert snapshot(eval_dir) == before


def test_a_sweep_point_without_its_evaluation_is_evaluated_again(world, tmp_path):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(world["sweep_dir"], sweep_dir)
    (run,) = (sweep_dir / "runs").iterdir()
    (run / "eval" / "summary.json").unlink()
    assert main(["sweep", str(world["root"] / "sweep.toml"), "--out", str(sweep_dir), "--no-progress"]) == 0
    assert (run / "eval" / "summary.json").is_file()
    import pandas as pd

    rerun = pd.read_parquet(sweep_dir / "results.parquet")
    original = pd.read_parquet(world["sweep_dir"] / "results.parquet")
    assert set(rerun.columns) == set(original.columns)
    assert rerun["oracle_id"].tolist() == original["oracle_id"].tolist()


def test_stray_checkpoint_folder_is_ignored(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 2, 2)
    stray = run_dir / "checkpoints" / "step_abc"
    stray.mkdir()
    (stray / "state.json").write_text(json.dumps({"step": 99}))
    assert main(["eval", str(run_dir), "--samples", "8", "--max-loops", "4"]) == 0
    assert stray.is_dir()


def test_garbage_result_json_reruns_the_point(world, tmp_path):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(world["sweep_dir"], sweep_dir)
    (run,) = (sweep_dir / "runs").iterdir()
    (run / "result.json").write_text("garbage{")
    assert main(["sweep", str(world["root"] / "sweep.toml"), "--out", str(sweep_dir), "--no-progress"]) == 0
    assert json.loads((run / "result.json").read_text())["status"] == "done"


def test_failed_start_does_not_block_the_corrected_command(world, tmp_path):
    """A run that fails before its first checkpoint leaves a config the corrected re-run may replace."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.toml").write_text((world["run"] / "config.toml").read_text())  # as left by a failed start
    result = run_cli("train", str(world["cfg"]), "--set", "train.steps=2", "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr


def test_debug_variable_shows_the_traceback(world, tmp_path):
    result = run_cli("eval", str(world["root"] / "missing"), env_extra={"LOOPLAB_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_second_writer_of_a_run_dir_is_refused_with_the_holders_pid(tmp_path):
    config = tmp_path / "tiny.toml"
    # far more steps than the test lasts: the first run must still hold the lock when the second starts
    config.write_text(TINY.format(steps=1_000_000, checkpoint_every=100_000))
    first = subprocess.Popen(
        [sys.executable, "-m", "looplab", "train", str(config), "--out", str(tmp_path / "run"), "--no-progress"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "log.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = run_cli("train", str(config), "--out", str(tmp_path / "run"), "--no-progress")
        assert second.returncode == 2
        assert f"is in use by process {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()
    with exclusive_lock(tmp_path / "run", "run dir"):  # the holder's death (SIGKILL) released the lock
        pass


def test_killed_sweep_leaves_no_worker_behind(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY.format(steps=3000, checkpoint_every=1000))
    (tmp_path / "sweep.toml").write_text("[sweep]\nconfigs = ['tiny.toml']\nseeds = [0, 1]\n")
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "looplab",
            "sweep",
            str(tmp_path / "sweep.toml"),
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "2",
            "--no-progress",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 60
    while len(_children(sweep.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = _children(sweep.pid)
    assert len(workers) >= 2
    sweep.kill()
    sweep.wait()
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers), "sweep workers outlived the sweep"


def _children(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_checkpoint_that_cannot_be_written_is_one_line_and_leaves_no_debris(tmp_path):
    """A file-size limit (as a full disk) while checkpointing: one line, exit 2, no partial checkpoint."""
    (tmp_path / "tiny.toml").write_text(TINY.format(steps=20, checkpoint_every=10))
    command = (
        f"ulimit -f 40; exec {sys.executable} -m looplab train {tmp_path / 'tiny.toml'} "
        f"--out {tmp_path / 'run'} --no-progress"
    )
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot write checkpoint" in result.stderr
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []
    again = run_cli("train", str(tmp_path / "tiny.toml"), "--out", str(tmp_path / "run"), "--no-progress")
    assert again.returncode == 0, again.stderr


def test_a_full_disk_during_eval_keeps_the_previous_evaluation(world, tmp_path, capsys, monkeypatch):
    import errno

    import pandas as pd

    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    assert main(["eval", str(run), "--scaling"]) == 0
    before = snapshot(run / "eval")
    capsys.readouterr()
    original, calls = pd.DataFrame.to_parquet, []

    def disk_fills_up(frame, path, *args, **kwargs):  # the second parquet file finds the disk full
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"half a file")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return original(frame, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_fills_up)
    assert main(["eval", str(run), "--scaling"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("looplab: error: No space left on device: "), err
    assert snapshot(run / "eval") == before  # every earlier file as it was, nothing half-written beside them
    assert not [p for p in (run / "eval").rglob("*") if p.name.startswith((".tmp_", ".staging"))]


def test_a_run_dir_deleted_while_training_ends_in_one_line(tmp_path, capsys, monkeypatch):
    import looplab.train.trainer as trainer

    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(steps=40, checkpoint_every=20))
    run_dir = tmp_path / "run"
    original = trainer.train_step

    def step_then_lose_the_dir(exp, optimizer, step, parallel):
        if step == 7:
            shutil.rmtree(run_dir)
        return original(exp, optimizer, step, parallel)

    monkeypatch.setattr(trainer, "train_step", step_then_lose_the_dir)
    assert main(["train", str(config), "--out", str(run_dir), "--no-progress", "--set", "train.log_every=5"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"looplab: error: run dir {run_dir} was removed during training, at step 10: nothing more is saved"
    ]
    assert not run_dir.exists()
