"""``looplab generate`` on a tiny byte-level LM run: text in, text out, depths reported, bad input refused."""

from __future__ import annotations

import pytest

from looplab.config import load_config
from looplab.experiment import Experiment
from looplab.generation import ExitRule, generate
from looplab.generation.text import encode, generate_text, head_halts
from looplab.train.trainer import train
from tests.conftest import run_cli, train_tiny_run
from tests.integration.test_stars_lm import TINY as TINY_LM


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("generate") / "lm"
    train(load_config(None, TINY_LM), run_dir, progress=False)
    return run_dir


def test_generate_prints_each_completion_and_the_depths(lm_run, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("In the beginning\nk=7;q=k+1;q?\n", encoding="utf-8")
    result = run_cli(
        "generate", str(lm_run), "--prompt", "And God said", "--prompts-file", str(prompts),
        "--max-new-tokens", "5", "--exit", "convergence", "--loops", "6", "--show-depths",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    completions = [line for line in lines if " -> " in line]
    assert [line.split(" -> ")[0] for line in completions] == ["'And God said'", "'In the beginning'", "'k=7;q=k+1;q?'"]
    depth_lines = [line for line in lines if line.strip().startswith("loops per token:")]
    assert len(depth_lines) == 3
    assert all(1 <= int(d) <= 6 for line in depth_lines for d in line.split(":")[1].split())
    assert lines[-1].startswith("generate: 15 tokens, convergence exit (loops 6), mean depth")


def test_greedy_generation_is_the_same_with_and_without_the_cache(lm_run):
    outputs = []
    for cache in ("per_loop", "none", "last_m --keep-loops 8"):
        result = run_cli(
            "generate", str(lm_run), "--prompt", "k=3;", "--max-new-tokens", "6", "--cache", *cache.split()
        )
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.splitlines()[0])
    assert outputs[0] == outputs[1] == outputs[2]


def test_the_halting_exit_reads_the_runs_own_head(tmp_path):
    """A text run trained with a halting schedule: the halting exit stops tokens where its head says halt
    (read on each token's state at the loops the schedule decides at), within the cap."""
    run_dir = tmp_path / "lm-halting"
    overrides = [o for o in TINY_LM if not o.startswith("schedule.")]
    train(load_config(None, [*overrides, "schedule.name=rl_halting", "schedule.t_max=6"]), run_dir, progress=False)
    completions, result = generate_text(run_dir, ["k=3;q=k+1;q?", "In"], 4, ExitRule("halting", 6))
    assert [len(c.depths) for c in completions] == [4, 4]
    assert all(1 <= d <= 6 for c in completions for d in c.depths)
    exp = Experiment.from_run(run_dir)
    reference = generate(exp.model, [encode("In")], 4, ExitRule("halting", 6, halts=head_halts(exp.schedule)))
    assert reference.depths[0] == completions[1].depths


def test_a_stop_string_ends_the_row_where_it_first_appears(lm_run):
    free, _ = generate_text(lm_run, ["k=3;", "In"], 30)
    stops = [next((ch for ch in c.text[1:] if ch != "\ufffd"), c.text[0]) for c in free]
    for completion, stop in zip(free, stops):
        stopped, _ = generate_text(lm_run, [completion.prompt], 30, stops=[stop])
        assert stopped[0].text == completion.text[: completion.text.index(stop) + 1]
        assert len(stopped[0].depths) < 30 or completion.text.index(stop) == len(completion.text) - 1


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "no prompt: give --prompt TEXT"),
        (["--prompt", "x", "--cache", "none", "--exit", "kl"], "use the fixed exit"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max new tokens must be >= 1"),
        (["--prompt", "x", "--temperature", "-1"], "temperature must be >= 0"),
        (["--prompt", "x", "--loops", "-2"], "must be >= 1"),
        (["--prompts-file", "/nonexistent/prompts.txt"], "cannot read prompts file"),
        (["--prompt", "x", "--exit", "halting"], "needs a halting head; this run's 'fixed' schedule has none"),
        (["--prompt", "x", "--cache", "last_m", "--keep-loops", "0"], "keeps >= 1 loops per token"),
    ],
)
def test_bad_generate_arguments_are_one_line_exit_2(lm_run, extra, message):
    result = run_cli("generate", str(lm_run), *extra)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_a_run_of_a_non_text_task_is_refused(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 2, 2)
    result = run_cli("generate", str(run_dir), "--prompt", "x")
    assert result.returncode == 2 and "whose tokens are not text" in result.stderr
