"""``looplab generate`` on a tiny byte-level LM run: text in, text out, depths reported, bad input refused."""

from __future__ import annotations

import json

import pytest

from looplab.config import load_config
from looplab.experiment import Experiment
from looplab.generation import GenerationExit, generate
from looplab.generation.byte_text import encode, head_halts
from looplab.generation.options import DecodeOptions
from looplab.generation.text import generate_text
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


def test_json_output_has_one_object_per_prompt_and_the_summary_on_stderr(lm_run, capsys):
    """``--json`` on a run dir: JSON Lines on stdout (the byte tokens of each prompt after ``<s>``, the new ids,
    their text, loops and log-probabilities), the summary line on stderr; ``--dtype`` is a model dir's."""
    from looplab.cli import main
    from looplab.generation.byte_text import decode

    prompts = ["In the beginning", "k=7;"]
    argv = ["generate", str(lm_run), *(arg for p in prompts for arg in ("--prompt", p)), "--max-new-tokens", "5"]
    assert main([*argv, "--json", "--exit", "convergence", "--loops", "3"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["prompt"] for row in rows] == prompts and err.startswith("generate: 10 tokens, convergence exit")
    for prompt, row in zip(prompts, rows):
        assert set(row) == {"prompt", "prompt_ids", "token_ids", "text", "loops", "logprobs"}
        assert row["prompt_ids"] == encode(prompt) and row["text"] == decode(row["token_ids"])
        assert len(row["token_ids"]) == len(row["loops"]) == len(row["logprobs"]) == 5
        assert set(row["loops"]) <= {1, 2, 3} and all(lp <= 0 for lp in row["logprobs"])
    assert main([*argv, "--dtype", "bfloat16"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--dtype applies to a model dir (config.json)" in err and err.count("\n") == 1


def test_greedy_generation_is_the_same_with_and_without_the_cache(lm_run):
    outputs = []
    for cache in ("per_loop", "none", "last_m --keep-loops 8"):
        result = run_cli(
            "generate", str(lm_run), "--prompt", "k=3;", "--max-new-tokens", "6", "--cache", *cache.split()
        )
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.splitlines()[0])
    assert outputs[0] == outputs[1] == outputs[2]


def test_speculative_generation_prints_the_fixed_depths_tokens_and_its_drafts(lm_run, capsys):
    """``--draft-loops k --draft-tokens n``: the same JSON tokens and loops as fixed-K greedy decoding, and the
    drafts kept on the summary line."""
    from looplab.cli import main

    argv = ["generate", str(lm_run), "--prompt", "And God said", "--prompt", "k=3;", "--max-new-tokens", "8"]
    argv += ["--loops", "4", "--json"]
    assert main(argv) == 0
    fixed = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.splitlines()]
    assert main([*argv, "--draft-loops", "2", "--draft-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["token_ids"] for row in rows] == fixed and all(set(row["loops"]) == {4} for row in rows)
    assert "drafts of 3 at 2 loops: " in err and " kept (" in err


def test_depth_wise_batching_prints_the_step_decoders_tokens_and_loops(lm_run, capsys):
    """``--batching depth``, with one row that the prompts take in turn (``--max-batch 1``), and ``--batching
    wavefront`` (every front, and 2): each prompt's JSON tokens and loops are the step decoder's (rows at mixed
    depths are tests/unit/test_depthwise.py's and test_wavefront.py's, in float64: this tiny run's exits sit at
    float32 noise)."""
    from looplab.cli import main

    argv = ["generate", str(lm_run), "--prompt", "And God said", "--prompt", "k=3;", "--max-new-tokens", "8"]
    argv += ["--loops", "5", "--json"]
    runs = []
    ways = (
        ["--batching", "step"],
        ["--batching", "depth"],
        ["--batching", "depth", "--max-batch", "1"],
        ["--batching", "wavefront"],
        ["--batching", "wavefront", "--front", "2"],
    )
    for flags in ways:
        assert main([*argv, *flags]) == 0
        runs.append([(r["token_ids"], r["loops"]) for r in map(json.loads, capsys.readouterr().out.splitlines())])
    assert all(run == runs[0] for run in runs[1:])
    assert all(loops == [5] * 8 for _, loops in runs[1])


def test_the_halting_exit_reads_the_runs_own_head(tmp_path):
    """A text run trained with a halting schedule: the halting exit stops tokens where its head says halt
    (read on each token's state at the loops the schedule decides at), within the cap."""
    run_dir = tmp_path / "lm-halting"
    overrides = [o for o in TINY_LM if not o.startswith("schedule.")]
    train(load_config(None, [*overrides, "schedule.name=rl_halting", "schedule.t_max=6"]), run_dir, progress=False)
    completions, result = generate_text(run_dir, ["k=3;q=k+1;q?", "In"], 4, DecodeOptions(GenerationExit("halting", 6)))
    assert [len(c.depths) for c in completions] == [4, 4]
    assert all(1 <= d <= 6 for c in completions for d in c.depths)
    exp = Experiment.from_run(run_dir)
    reference = generate(
        exp.model, [encode("In")], 4, DecodeOptions(GenerationExit("halting", 6, halts=head_halts(exp.schedule)))
    )
    assert reference.depths[0] == completions[1].depths


def test_a_stop_string_ends_the_row_where_it_first_appears(lm_run):
    free, _ = generate_text(lm_run, ["k=3;", "In"], 30)
    stops = [next((ch for ch in c.text[1:] if ch != "\ufffd"), c.text[0]) for c in free]
    for completion, stop in zip(free, stops):
        stopped, _ = generate_text(lm_run, [completion.prompt], 30, stops=[stop])
        assert stopped[0].text == completion.text[: completion.text.index(stop) + 1]
        assert len(stopped[0].depths) < 30 or completion.text.index(stop) == len(completion.text) - 1


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    """Prompts files of every bad kind."""
    root = tmp_path_factory.mktemp("prompts")
    (root / "long.txt").write_text("In the beginning\n" + "a" * 200_000 + "\n", encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    return root


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "no prompt: give --prompt TEXT"),
        (["--prompt", "x", "--cache", "none", "--exit", "kl"], "use the fixed exit"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max new tokens must be in 1.."),
        (["--prompt", "x", "--max-new-tokens", "-5"], "max new tokens must be in 1.."),
        (["--prompt", "And", "--max-new-tokens", "1000000000"], "max new tokens must be in 1.."),
        (["--prompt", "And", "--max-new-tokens", "1000000000", "--cache", "none"], "max new tokens must be in 1.."),
        (["--prompt", "x", "--temperature", "-1"], "sampling.temperature must be in [0, inf)"),
        (["--prompt", "x", "--temperature", "inf"], "sampling.temperature must be in [0, inf), got inf"),
        (["--prompt", "x", "--temperature", "nan"], "sampling.temperature must be in [0, inf), got nan"),
        (["--prompt", "x", "--top-k", "-1"], "sampling.top_k must be in [0, inf), got -1"),
        (["--prompt", "x", "--seed", str(2**64)], "sampling.seed must be in"),
        (["--prompt", "x", "--loops", "-2"], "loops: must be an integer in 1..4096, got -2"),
        (["--prompt", "x", "--loops", "0"], "loops: must be an integer in 1..4096, got 0"),
        (["--prompt", "x", "--loops", "10000000"], "must be an integer in 1..4096, got 10000000"),
        (["--prompt", "x", "--stop", ""], "--stop '' is empty"),
        (["--prompts-file", "/nonexistent/prompts.txt"], "cannot read prompts file /nonexistent/prompts.txt"),
        (["--prompts-file", "{files}/long.txt"], "--prompts-file {files}/long.txt line 2: its 200001 tokens leave"),
        (["--prompts-file", "{files}/empty.txt"], "prompts file {files}/empty.txt is empty"),
        (["--prompts-file", "{files}/latin1.txt"], "prompts file {files}/latin1.txt is not UTF-8 text"),
        (
            ["--prompt", "x", "--exit", "halting"],
            "exit: the halting exit needs a halting head; this run's 'fixed' schedule has none",
        ),
        (
            ["--prompt", "x", "--exit", "nope"],
            "unknown generation exit 'nope'; valid choices: argmax-stability, confidence, convergence",
        ),
        (["--prompt", "x", "--exit", "kl", "--exit-param", "eps"], "--exit-param 'eps' must look like KEY=VALUE"),
        (["--prompt", "x", "--exit", "kl", "--exit-param", "eps=inf"], "eps: must be a finite number, got inf"),
        (["--prompt", "x", "--exit", "kl", "--exit-param", "eps=nan"], "eps: must be a finite number, got nan"),
        (["--prompt", "x", "--exit", "kl", "--exit-param", "eps=-1"], "eps: generate.exits.kl.eps must be in (0, inf)"),
        (["--prompt", "x", "--exit", "kl", "--exit-param", "eps=small"], "generate.exits.kl.eps must be float"),
        (
            ["--prompt", "x", "--exit", "kl", "--exit-param", "epsilon=1"],
            "epsilon: unknown field; valid fields: loops, exit, cache, decoder, eps, direction, read_only_exit",
        ),
        (["--prompt", "x", "--exit", "confidence", "--threshold", "1.5"], "confidence.threshold must be in (0, 1]"),
        (
            ["--prompt", "x", "--eps", "0.1"],
            "eps: a parameter of the convergence, kl, latent-diff, cosine, entropy-diff and minp-kl exits; this "
            "request",
        ),
        (
            ["--prompt", "x", "--exit", "kl", "--eps", "0.1", "--exit-param", "eps=0.2"],
            "eps is given twice (--eps and --exit-param eps): give it once",
        ),
        (
            ["--prompt", "x", "--cache", "last_m", "--keep-loops", "0"],
            "keep_loops: cache.last_m.keep_loops must be in [1, 4096], got 0",
        ),
        (
            ["--prompt", "x", "--cache", "last_m", "--keep-loops", "100000"],
            "keep_loops: cache.last_m.keep_loops must be in [1, 4096], got 100000",
        ),
        (
            ["--prompt", "x", "--loops", "4", "--draft-loops", "4"],
            "draft_loops must be in 1..3 (below the exit's 4 loops), got 4",
        ),
        (
            ["--prompt", "x", "--loops", "4", "--draft-loops", "2", "--draft-tokens", "0"],
            "draft_tokens: decoder.speculative.draft_tokens must be in [1, 64], got 0",
        ),
        (
            ["--prompt", "x", "--draft-tokens", "3"],
            "draft_tokens: a parameter of the speculative decoder; this request chooses exit fixed, cache per_loop",
        ),
        (
            ["--prompt", "x", "--draft-loops", "1", "--exit", "kl"],
            "the speculative decoder reads every token at one depth: use the fixed exit, not kl",
        ),
        (
            ["--prompt", "x", "--draft-loops", "1", "--cache", "shared"],
            "the speculative decoder decodes through the per_loop cache, not shared",
        ),
        (
            ["--prompt", "x", "--draft-loops", "1", "--temperature", "0.5"],
            "the speculative decoder is greedy: use temperature 0, not 0.5",
        ),
        (
            ["--prompt", "x", "--batching", "depth", "--cache", "shared"],
            "the depth decoder decodes through the per_loop",
        ),
        (
            ["--prompt", "x", "--decoder", "depth", "--batching", "step"],
            "--batching is the earlier spelling of --decoder",
        ),
        (
            ["--prompt", "x", "--decoder", "beam"],
            "decoder: unknown decoder 'beam'; valid choices: depth, recompute, speculative",
        ),
        (
            ["--prompt", "x", "--cache", "lru"],
            "cache: unknown KV cache policy 'lru'; valid choices: last_m, none, per_loop",
        ),
        (
            ["--prompt", "x", "--decoder-param", "max_batch=2"],
            "max_batch: a parameter of the depth decoder; this request",
        ),
        (
            ["--prompt", "x", "--cache", "last_m", "--cache-param", "keep_loops=2", "--keep-loops", "3"],
            "keep_loops is given twice",
        ),
        (
            ["--prompt", "x", "--batching", "depth", "--draft-loops", "1"],
            "draft_loops: a parameter of the speculative decoder;",
        ),
        (
            ["--prompt", "x", "--batching", "loop"],
            "decoder: unknown decoder 'loop'; valid choices: depth, recompute, speculative, step, wavefront",
        ),
        (
            ["--prompt", "x", "--max-batch", "2"],
            "max_batch: a parameter of the depth decoder; this request chooses exit fixed, cache per_loop, "
            "decoder step",
        ),
        (
            ["--prompt", "x", "--batching", "depth", "--max-batch", "-1"],
            "max_batch: decoder.depth.max_batch must be in [0, inf)",
        ),
        (
            ["--prompt", "x", "--front", "2"],
            "front: a parameter of the wavefront decoder; this request chooses exit fixed",
        ),
        (
            ["--prompt", "x", "--batching", "wavefront", "--front", "-1"],
            "front: decoder.wavefront.front must be in [0, inf)",
        ),
        (
            ["--prompt", "x", "--batching", "wavefront", "--temperature", "0.7"],
            "the wavefront decoder is greedy: use temperature 0, not 0.7",
        ),
        (
            ["--prompt", "x", "--batching", "wavefront", "--draft-loops", "1"],
            "draft_loops: a parameter of the speculative decoder; this request chooses exit fixed, cache per_loop, "
            "decoder wavefront",
        ),
    ],
)
def test_bad_generate_arguments_are_one_line_exit_2(lm_run, prompt_files, extra, message):
    result = run_cli("generate", str(lm_run), *(arg.format(files=prompt_files) for arg in extra))
    assert result.returncode == 2, result.stdout
    assert message.format(files=prompt_files) in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_the_earlier_eps_flag_sets_the_chosen_exits_eps(lm_run):
    """``--eps E`` is ``--exit-param eps=E``: a KL bound no step misses stops every token at loop 2."""
    outputs = []
    for flags in (["--eps", "1e9"], ["--exit-param", "eps=1e9"]):
        result = run_cli("generate", str(lm_run), "--prompt", "In", "--exit", "kl", "--loops", "6", *flags)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and "mean depth 2.00 (min 2, max 2)" in outputs[0]


def test_a_plugin_generation_exit_reads_its_parameter_from_the_run_and_the_command_line(tmp_path):
    """A run naming the top_margin plugin: ``--exit top_margin`` is known once the run's plugins are read, its
    margin comes from the run's [generate.exits.top_margin] table, and ``--exit-param`` overrides it."""
    run_dir, config = tmp_path / "lm-plugin", tmp_path / "empty.toml"
    config.write_text("")
    sets = [*TINY_LM, 'run.plugins=["looplab.examples.plugins.top_margin"]', "generate.exits.top_margin.margin=1e9"]
    trained = run_cli("train", str(config), "--out", str(run_dir), "--no-progress", *(f"--set={s}" for s in sets))
    assert trained.returncode == 0, trained.stderr
    assert "[generate.exits.top_margin]\nmargin = 1000000000.0" in (run_dir / "config.toml").read_text()
    common = ["generate", str(run_dir), "--prompt", "In", "--max-new-tokens", "3", "--exit", "top_margin"]
    never = run_cli(*common, "--loops", "5")  # no margin of 10⁹ nats: every token runs to the cap
    assert never.returncode == 0, never.stderr
    assert never.stdout.splitlines()[-1].startswith("generate: 3 tokens, top_margin exit (loops 5), mean depth 5.00")
    always = run_cli(*common, "--loops", "5", "--exit-param", "margin=1e-12")  # ties aside, loop 1 always
    assert always.returncode == 0, always.stderr
    assert "mean depth 1.00" in always.stdout
    refused = run_cli(*common, "--exit-param", "margin=-1")
    assert (
        refused.returncode == 2 and "generate.exits.top_margin.margin must be in (0, inf), got -1.0" in refused.stderr
    )
    elsewhere = run_cli("generate", str(tmp_path / "lm-plugin"), "--prompt", "In", "--exit", "top_margin2")
    assert (
        "valid choices: argmax-stability, confidence, convergence, cosine, entropy-diff, fixed, gate, halting, kl, "
        "latent-diff, minp-kl, top_margin" in elsewhere.stderr
    )


def test_a_run_of_a_non_text_task_is_refused(tmp_path):
    _, run_dir = train_tiny_run(tmp_path, 2, 2)
    result = run_cli("generate", str(run_dir), "--prompt", "x")
    assert result.returncode == 2 and "whose tokens are not text" in result.stderr


def test_a_plugin_cache_and_decoder_are_chosen_by_name_from_the_command_line(lm_run):
    """``--plugin`` imports the example cache policy and decoder; the decoder gives the step decoder's tokens,
    the cache reads what per_loop reads at one loop; their parameters come from --decoder-param."""
    common = ["generate", str(lm_run), "--prompt", "k=3;", "--prompt", "In the", "--max-new-tokens", "5", "--json"]

    def tokens(*extra):
        result = run_cli(*common, *extra)
        assert result.returncode == 0, result.stderr
        return [json.loads(line)["token_ids"] for line in result.stdout.splitlines()], result.stderr

    step, _ = tokens("--loops", "4")
    plugin = ["--plugin", "looplab.examples.plugins.one_at_a_time", "--decoder", "one_at_a_time"]
    alone, summary = tokens("--loops", "4", *plugin, "--decoder-param", "reverse=true")
    assert alone == step and "one_at_a_time decoder" in summary
    one_loop, _ = tokens("--loops", "1")
    first, summary = tokens("--loops", "1", "--plugin", "looplab.examples.plugins.first_loop", "--cache", "first_loop")
    assert first == one_loop and "first_loop cache" in summary
    refused = run_cli(*common, *plugin, "--decoder-param", "reverse=sometimes")
    assert refused.returncode == 2 and "decoder.one_at_a_time.reverse must be bool, got 'sometimes'" in refused.stderr
