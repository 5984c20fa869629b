"""The lm-evaluation-harness model ``looplab`` on the local tasks of tests/data/lm_eval: lm-eval's
numbers equal looplab's own ``score`` / ``generate`` on the same inputs, on a trained byte-level run and on
a retrofit dir, at a fixed depth and with an adaptive exit; bad model_args are one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from looplab.cli import main  # noqa: E402
from looplab.config import load_config  # noqa: E402
from looplab.errors import LooplabError  # noqa: E402
from looplab.generation import generate, score  # noqa: E402
from looplab.harness import build, register  # noqa: E402
from looplab.train.trainer import train  # noqa: E402
from tests.integration.test_stars_lm import TINY  # noqa: E402
from tests.lm_dirs import save_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "data" / "lm_eval"
LOGLIK_ATOL = 1e-6
#: model → its model_args, and an adaptive exit's (thresholds that put this tiny model's tokens at mixed depths).
#: Batches of 3: a row's exit must not depend on the rows beside it, so a threshold must sit clear of float noise.
#: The convergence test (a relative state change) does; KL(p_t ‖ p_t−1) of this untrained model's near-uniform
#: distributions is ~1e-5, a difference of log-probs of size 5 in float32 (noise ~1e-6), so batch composition
#: flips some kl exits (measured: 10 of 54 tokens at eps=1e-7, 1 of 48 generated at eps=1e-5 after 40 steps).
#: The kl exit runs at batch_size=1 here; a retrofit's coda rules out the exits that read logits each loop.
SETUPS = {
    "run": "loops=6,batch_size=3",
    "retrofit": "loops=6,prefix_token=0,batch_size=3",
}
EXITS = {
    ("run", "fixed"): "",
    ("run", "convergence"): "exit=convergence,eps=0.01",
    ("run", "kl"): "exit=kl,eps=1e-7,batch_size=1",
    ("retrofit", "fixed"): "",
    ("retrofit", "convergence"): "exit=convergence,eps=0.03",
}
CAP = 6

register()  # what the installed .pth does when lm-eval loads its models (tested in a fresh interpreter below)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    train(load_config(None, TINY), root / "run", progress=False)
    save_model_dir("llama", root / "llama")
    assert (
        main(f"retrofit {root / 'llama'} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'rf'}".split())
        == 0
    )
    return {"run": root / "run", "retrofit": root / "rf"}


@pytest.fixture(scope="module")
def tasks():
    return TaskManager(include_path=str(TASKS), include_defaults=False)  # lm-eval's own ~10k YAMLs: 10 s to index


def _model(paths, name: str, extra: str = ""):
    """The lm-eval model through lm-eval's registry and its model_args parser (a later key wins)."""
    args = dict(arg.split("=") for arg in ",".join(filter(None, [SETUPS[name], extra])).split(","))
    return get_model("looplab").create_from_arg_string(",".join([f"path={paths[name]}", *map("=".join, args.items())]))


def _evaluate(lm, tasks):
    return lm_eval.simple_evaluate(
        model=lm, tasks=["looplab_local"], task_manager=tasks, log_samples=True, verbosity="ERROR"
    )["samples"]


def _pair(lm, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The token ids lm-eval scores: a causal split of context + continuation, or the prefix token before
    the continuation of an empty context."""
    if not context:
        return [lm.prefix_token_id], lm.lm.encode(continuation, prompt=False)
    whole, head = lm.lm.encode(context + continuation), lm.lm.encode(context)
    assert whole[: len(head)] == head
    return head, whole[len(head) :]


def _reference(lm, samples):
    """looplab's own numbers for every request in ``samples``: (loglik, is_greedy, depths) per loglikelihood
    pair, (loglik, depths) per rolling text, (text, depths) per generation, each request alone."""
    text_lm = lm.lm
    out = {"loglikelihood": [], "rolling": [], "generate": []}
    for sample in samples["looplab_choice"]:
        for context, continuation in sample["arguments"]:
            head, tail = _pair(lm, context, continuation)
            scored = score(text_lm.model, [head + tail], lm.options, len(head))
            greedy = generate(text_lm.model, [head], len(tail), lm.options)
            out["loglikelihood"].append((sum(scored.logprobs[0]), greedy.tokens[0] == tail, scored.depths[0]))
    for sample in samples["looplab_rolling"]:
        (text,) = sample["arguments"][0]
        ids = [lm.prefix_token_id] + text_lm.encode(text, prompt=False)
        assert len(ids) <= text_lm.max_context  # one window: the text scored from the prefix token
        scored = score(text_lm.model, [ids], lm.options, 1)
        out["rolling"].append((sum(scored.logprobs[0]), scored.depths[0]))
    for sample in samples["looplab_generate"]:
        context, kwargs = sample["arguments"][0]
        until = kwargs["until"]

        def done(ids, until=until):
            return any(stop in text_lm.decode(ids) for stop in until)

        result = generate(text_lm.model, [text_lm.encode(context)], kwargs["max_gen_toks"], lm.options, done)
        text = text_lm.decode(result.tokens[0])
        for stop in until:
            text = text.split(stop)[0]
        out["generate"].append((text, result.depths[0]))
    return out


def _compare(lm, samples) -> dict[str, float]:
    """Assert lm-eval's answers equal looplab's; the largest |Δ loglik| per request type."""
    reference = _reference(lm, samples)
    harness = {
        "loglikelihood": [resp[0] for sample in samples["looplab_choice"] for resp in sample["resps"]],
        "rolling": [sample["resps"][0][0] for sample in samples["looplab_rolling"]],
        "generate": [sample["resps"][0][0] for sample in samples["looplab_generate"]],
    }
    gaps = {}
    got, want = harness["loglikelihood"], reference["loglikelihood"]
    assert [g[1] for g in got] == [w[1] for w in want]
    gaps["loglikelihood"] = max(abs(g[0] - w[0]) for g, w in zip(got, want))
    gaps["rolling"] = max(abs(g - w[0]) for g, w in zip(harness["rolling"], reference["rolling"]))
    assert harness["generate"] == [w[0] for w in reference["generate"]]
    assert any(harness["generate"])  # something was generated before the stops
    assert max(gaps.values()) <= LOGLIK_ATOL, gaps
    # the depths lm-eval's requests ran at are looplab's, token for token (lm-eval orders requests its own way)
    ran = lm.depths
    assert sorted(ran["loglikelihood"]) == sorted(w[2] for w in want)
    assert sorted(ran["loglikelihood_rolling"]) == sorted(w[1] for w in reference["rolling"])
    assert sorted(ran["generate_until"]) == sorted(w[1] for w in reference["generate"])
    return gaps


@pytest.mark.parametrize("name, exit", sorted(EXITS), ids=["-".join(key) for key in sorted(EXITS)])
def test_lm_eval_numbers_are_looplabs(paths, tasks, name, exit):
    lm = _model(paths, name, EXITS[name, exit])
    gaps = _compare(lm, _evaluate(lm, tasks))
    print(name, exit, {kind: f"{gap:.1e}" for kind, gap in gaps.items()})
    flat = [d for rows in lm.depths.values() for row in rows for d in row]
    assert max(flat) <= CAP
    if exit != "fixed":  # tokens stop at different loops below the cap, and equality holds token by token
        assert min(flat) < CAP and len(set(flat)) >= 2
    else:
        assert set(flat) == {CAP}


def _requests(*args) -> list:
    return [SimpleNamespace(args=a) for a in args]


def test_rolling_windows_cover_a_long_text_once(paths):
    """A text longer than the retrofit's 64-token context: lm-eval's disjoint windows, each token scored once."""
    lm = _model(paths, "retrofit")
    text = "And God said, Let there be light: and there was light. " * 6
    ids = lm.lm.encode(text, prompt=False)
    width = lm.lm.max_context - 1
    assert width < len(ids) <= 2 * width
    (total,) = lm.loglikelihood_rolling(_requests((text,)))
    first = score(lm.lm.model, [[lm.prefix_token_id] + ids[:width]], lm.options, 1)
    rest = len(ids) - width  # the second window predicts the rest, after as much context as fits
    second = score(lm.lm.model, [ids[rest - 1 :]], lm.options, width - rest + 1)
    assert total == pytest.approx(sum(first.logprobs[0]) + sum(second.logprobs[0]), abs=LOGLIK_ATOL)
    assert len(lm.depths["loglikelihood_rolling"][0]) == len(ids)


def test_sampling_follows_do_sample_and_temperature(paths):
    lm = _model(paths, "run", "seed=7")
    context = "In the beginning"
    greedy = {"until": [], "max_gen_toks": 8}
    sampled = {"until": [], "max_gen_toks": 8, "do_sample": True, "temperature": 1.5, "top_k": 20}
    texts = lm.generate_until(_requests((context, greedy), (context, sampled), (context, {**greedy, "temperature": 0})))
    assert texts[0] == texts[2]  # temperature 0 without do_sample is greedy
    from looplab.generation import Sampling

    reference = generate(lm.lm.model, [lm.lm.encode(context)], 8, lm.options.but(sampling=Sampling(1.5, 20, 7)))
    assert texts[1] == lm.lm.decode(reference.tokens[0]) != texts[0]


BAD_ARGS = [
    ("", "needs path=DIR"),
    ("loops=2,loops=3", "model_arg loops is given twice"),
    ("loops=0", "model_arg loops: must be an integer in 1..4096, got 0"),
    ("loops=two", "model_arg loops: must be an integer in 1..4096, got 'two'"),
    (
        "exit=sometimes",
        "unknown generation exit 'sometimes'; valid choices: argmax-stability, confidence, convergence, cosine",
    ),
    ("exit=fixed,eps=0.1", "model_arg eps: a parameter of the convergence, kl"),
    ("exit=kl,eps=-1", "eps"),
    ("exit=halting", "needs a halting head"),
    ("cache=lru", "model_arg cache: unknown KV cache policy 'lru'; valid choices: last_m, none, per_loop, shared"),
    ("cache=none,exit=kl", "use the fixed exit"),
    ("cache=last_m,keep_loops=0", "model_arg keep_loops: cache.last_m.keep_loops must be in [1, 4096], got 0"),
    ("dtype=float16", "unknown model_arg dtype 'float16'; valid choices: bfloat16, float32"),
    ("batch_size=auto", "batch_size must be a positive integer, got 'auto'"),
    ("device=tpu", "device must be cpu, cuda or cuda:N"),
    ("prefix_token=-1", "prefix_token must be a token id in 0..259"),
    ("temperature=0.5", "unknown looplab model_arg 'temperature'; valid choices: batch_size, cache, decoder, device"),
    ("cache=shared,decoder=depth", "the depth decoder decodes through the per_loop cache, not shared"),
    ("max_batch=2", "model_arg max_batch: a parameter of the depth decoder; this request chooses exit fixed"),
]


@pytest.mark.parametrize("args, message", BAD_ARGS, ids=[a or "no-path" for a, _ in BAD_ARGS])
def test_bad_model_args_are_one_line_errors(paths, args, message):
    model_args = ",".join(filter(None, [f"path={paths['run']}" if args else "", args]))
    with pytest.raises(LooplabError) as error:
        get_model("looplab").create_from_arg_string(model_args)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_plugin_exits_own_parameter_is_a_model_arg(paths, monkeypatch):
    _register_top_margin(monkeypatch)

    lm = get_model("looplab").create_from_arg_string(f"path={paths['run']},exit=top_margin,margin=0.5,loops=6")
    assert lm.options.exit_rule.name == "top_margin" and lm.options.exit_rule.params.margin == 0.5
    with pytest.raises(
        LooplabError, match="model_arg margin: a parameter of the top_margin exit; this request chooses exit kl"
    ):
        get_model("looplab").create_from_arg_string(f"path={paths['run']},exit=kl,margin=0.5")


def test_a_retrofit_refuses_a_missing_prefix(paths):
    with pytest.raises(LooplabError, match="give model_arg prefix_token"):
        get_model("looplab").create_from_arg_string(f"path={paths['retrofit']}")


def test_a_tasks_generation_kwargs_may_choose_the_decoding(paths):
    """Decode fields in a request's gen_kwargs, parsed by the parser the CLI and the server use, override the
    model_args' for that request: its tokens are generate's with those options."""
    from looplab.generation import Sampling
    from looplab.generation.fields import decode_options

    lm = _model(paths, "run", "loops=3")
    context = "In the beginning"
    chosen = {"exit": "kl", "loops": 6, "eps": 0.05, "decoder": "depth", "max_batch": 1}
    plain, decoded = lm.generate_until(
        _requests((context, {"until": [], "max_gen_toks": 8}), (context, {"until": [], "max_gen_toks": 8, **chosen}))
    )
    for text, fields in ((plain, {"loops": 3}), (decoded, chosen)):
        options = decode_options(fields, lm.lm, Sampling())
        reference = generate(lm.lm.model, [lm.lm.encode(context)], 8, options)
        assert text == lm.lm.decode(reference.tokens[0])
    assert lm.depths["generate_until"][0] == [3] * 8 and max(lm.depths["generate_until"][1]) <= 6


BAD_GEN_KWARGS = [
    ({"num_beams": 4}, "unknown generate_until argument 'num_beams'; valid choices: cache, decoder, do_sample, exit"),
    ({"exit": "nope"}, "unknown generation exit 'nope'; valid choices"),
    ({"loops": 0}, "generate_until argument loops: must be an integer in 1..4096, got 0"),
    ({"max_batch": 2}, "generate_until argument max_batch: a parameter of the depth decoder"),
    ({"top_p": 0.9}, "top_p must be 1"),
    ({"max_gen_toks": 0}, "max_gen_toks must be a positive integer"),
    ({"max_gen_toks": 512}, "max_gen_toks = 512 leaves no room for a prompt in the model's context of 512"),
    ({"until": [3]}, "until must be strings"),
]


@pytest.mark.parametrize("kwargs, message", BAD_GEN_KWARGS, ids=[next(iter(k)) for k, _ in BAD_GEN_KWARGS])
def test_bad_generation_arguments_are_one_line_errors(paths, kwargs, message):
    lm = _model(paths, "run")
    with pytest.raises(LooplabError) as error:
        lm.generate_until(_requests(("In the", kwargs)))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_fresh_interpreter_finds_the_model_through_the_installed_pth(tmp_path):
    """What ``lm_eval --model looplab`` does first, in a fresh interpreter whose site dir holds the .pth the
    build ships: lm-eval's registry resolves ``looplab`` (and still its own models; nothing imported early)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / build.PTH_NAME).write_text(build.PTH_LINE, encoding="utf-8")
    program = (
        f"import site, sys; site.addsitedir({str(site)!r}); "
        "early = sorted(m for m in ('torch', 'lm_eval') if m in sys.modules); "
        "from lm_eval.api.registry import get_model; "
        "print(early, get_model('looplab').__qualname__, get_model('dummy').__qualname__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "LooplabLM", "DummyLM"]


def test_python_m_looplab_harness_is_lm_evals_cli_with_one_line_errors(paths, monkeypatch, capsys):
    """``python -m looplab.harness ARGS`` runs lm-eval's CLI with the model registered (lm-eval's CLI is
    replaced here by what it does first: build the model from its model_args)."""
    import lm_eval.__main__

    from looplab.harness.__main__ import main as harness_main

    build_model = lambda: get_model("looplab").create_from_arg_string(f"path={paths['run']},cache=lru")
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", build_model)
    assert harness_main() == 2
    assert capsys.readouterr().err == (
        "looplab: error: model_arg cache: unknown KV cache policy 'lru'; valid choices: last_m, none, per_loop, "
        "shared\n"
    )


def test_pyproject_builds_the_pth_and_lm_eval_is_imported_by_the_harness_only():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["cmdclass"]["build_py"] == "looplab.harness.build.BuildPyWithPth"
    importers = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "looplab").rglob("*.py")
        if re.search(r"^\s*(import|from) lm_eval\b", path.read_text(), re.MULTILINE) and path.parent.name != "harness"
    ]
    assert importers == []


#: (model_args tail, lm_eval flags, the one line's text): bad input through lm-eval's own CLI entry point
CLI_BAD = [
    ("loops=0", [], "model_arg loops: must be an integer in 1..4096, got 0"),
    (
        "cache=bogus",
        [],
        "model_arg cache: unknown KV cache policy 'bogus'; valid choices: last_m, none, per_loop, shared",
    ),
    ("", ["--batch_size", "auto"], "batch_size must be a positive integer, got 'auto'"),
    ("", ["--gen_kwargs", "top_p=0.9"], "top_p must be 1"),
]


def _lm_eval_cli(paths, tail: str, flags: list[str]) -> subprocess.CompletedProcess:
    """``lm_eval --model looplab`` (the installed entry point) on the local generation task, 2 documents."""
    command = [
        str(Path(sys.executable).parent / "lm_eval"), "--model", "looplab",
        "--model_args", f"path={paths['run']}{',' if tail and not tail.startswith(',') else ''}{tail}",
        "--include_path", str(TASKS), "--tasks", "looplab_generate", "--limit", "2", *flags,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOOPLAB_DEBUG": ""}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("tail, flags, message", CLI_BAD, ids=[f"cli-{i}" for i in range(len(CLI_BAD))])
def test_lm_evals_cli_prints_one_line_and_exits_2_on_bad_input(paths, tail, flags, message):
    done = _lm_eval_cli(paths, tail, flags)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("looplab: error: ") and message in last, last


def test_lm_evals_own_device_and_batch_size_may_also_be_model_args(paths):
    done = _lm_eval_cli(paths, "device=cpu,batch_size=2", [])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "looplab_generate" in done.stdout


def _register_top_margin(monkeypatch) -> None:
    """The example plugin exit ``top_margin`` in the registry for this test, as a run's plugins would put it
    (other tests take plugin entries out of the registry again, so the import alone is not enough)."""
    from looplab.examples.plugins.top_margin import TopMargin, top_margin
    from looplab.token_exits import EXITS, TokenExit

    monkeypatch.setitem(EXITS, "top_margin", TokenExit("top_margin", True, 1, top_margin, params=TopMargin))
