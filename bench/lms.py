"""The looped LMs the generation benchmarks time: a byte-level LM trained by a preset (or a given run),
and the SmolLM2-135M retrofit of the mechanistic study."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from looplab.errors import LooplabError

#: the generation demo model: d 64, a 2-layer core, loops in [1, 16], KJV text and chain-trace problems
PRESET = "generation/kjv_trace"


def trained_lm(run_dir: str | None, scratch: str, steps: int, threads: int, sets: tuple[str, ...] = ()) -> str:
    """``run_dir``, or a run of :data:`PRESET` trained for ``steps`` steps under ``scratch`` (``sets``: more
    ``--set KEY=VALUE`` overrides)."""
    if run_dir is not None:
        return run_dir
    run_dir = str(Path(scratch) / "lm")
    overrides = [f"train.steps={steps}", f"run.threads={threads}", *sets]
    command = [sys.executable, "-m", "looplab", "train", PRESET, "--out", run_dir, "--no-progress"]
    subprocess.run(command + [arg for value in overrides for arg in ("--set", value)], check=True, capture_output=True)
    return run_dir


def smollm2_retrofit(section: str):
    """The (4, 6⊗r, 4) retrofit of SmolLM2-135M with W_I = [I/2 | I/2], not fine-tuned, in eval mode, and its
    tokenizer; None (after printing that ``section`` is skipped) when the model is not installed."""
    from looplab.lm.retrofit import RetrofittedLoop
    from looplab.text.pretrained import load_smollm2

    try:
        pretrained, tokenizer = load_smollm2()
    except LooplabError as err:
        print(f"{section}: skipped ({err})")
        return None
    return RetrofittedLoop(pretrained, 4, 6, 4, inject_init="mix").eval(), tokenizer


def start_lm_bench(description: str):
    """Parse the options of a benchmark on the byte-level LM and the retrofit (``--run-dir``, ``--steps``,
    ``--repeats``, ``--threads``, ``--no-retrofit``), fix threads and seeds, print the machine, and open the LM
    (trained here when no run is given). Returns (options, the LM's Experiment)."""
    from timing import machine_line, setup

    from looplab.experiment import Experiment

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run-dir", help="a trained byte-level LM run (default: train the preset here)")
    parser.add_argument("--steps", type=int, default=800, help="training steps when no run is given")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-retrofit", action="store_true", help="time the byte-level LM only")
    args = parser.parse_args()
    setup(args.threads, 0)
    print(machine_line())
    with tempfile.TemporaryDirectory() as scratch:
        return args, Experiment.from_run(trained_lm(args.run_dir, scratch, args.steps, args.threads))


def kjv_byte_windows(exp, salt: str, count: int = 32, length: int = 63) -> list[list[int]]:
    """``count`` KJV validation windows of the run's task: the start token, then ``length`` bytes."""
    from looplab.seeding import derive_generator

    tokens, _ = exp.task.sample_split(length, count, derive_generator(0, salt), "val")
    return [row.tolist() for row in tokens]


def kjv_token_windows(tokenizer, count: int = 8, tokens: int = 64) -> list[list[int]]:
    """``count`` KJV validation prompts of ``tokens`` tokens of ``tokenizer``, 4000 characters apart."""
    from looplab.tasks.corpus import load_corpus

    text = load_corpus().text("val")
    return [tokenizer(text[i * 4000 : i * 4000 + 600])["input_ids"][:tokens] for i in range(count)]
