"""``looplab generate DIR`` on model dirs — HRM-Text, Inkling-2 loop and a retrofit of a Llama, tiny random
models written by save_pretrained beside a tokenizer trained here (nothing downloaded) — with the per-loop
KV cache: greedy tokens against transformers' own ``generate``, the cache against recomputation at other
loop counts, adaptive exits, the ``--json`` output and bad input.

What is exact and what is not: at the native loop count the tokens are transformers' ``generate(do_sample=False)``
and the log-probabilities agree to float32 rounding; at any loop count K the per-loop cache gives what
recomputing the whole sequence at K gives. An adaptive exit has no recomputed reference beyond a row's
first new token (a later token reads an exited token's entries at its exit depth, which no single forward
computes), so there the first token is checked against the adapter's own unroll and the rest against
batching, the exit's extremes and the depth range."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.generation import GenerationExit  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.generation.step import Decoder  # noqa: E402
from looplab.generation.text import generate_text  # noqa: E402
from looplab.generation.text_lm import open_text_lm  # noqa: E402
from looplab.generation.views import decodable  # noqa: E402
from tests.integration.test_model_dirs import _source  # noqa: E402
from tests.lm_dirs import save_model_dir  # noqa: E402

FAMILIES = ("hrm_text", "inkling2_loop", "retrofit")
NATIVE = {"hrm_text": 3, "inkling2_loop": 3, "retrofit": 1}
#: mixed lengths (5, 12 and 1 tokens under the tiny tokenizer)
PROMPTS = ["And God said", "In the beginning God created the heaven and the earth", "light"]
NEW = 6
#: float32 rounding between a cached and a recomputed path, or transformers' and looplab's attention
ATOL = 1e-5
#: an adaptive exit per family whose depths on PROMPTS are mixed (measured: several depths in 2..4)
ADAPTIVE = {
    "hrm_text": GenerationExit("kl", 4, {"eps": 0.01}),
    "inkling2_loop": GenerationExit("convergence", 4, {"eps": 0.5}),
    "retrofit": GenerationExit("convergence", 4, {"eps": 0.1}),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """family → model dir (the retrofit written by ``looplab retrofit`` from a 4-layer Llama, the source kept)."""
    root = tmp_path_factory.mktemp("generate_model_dirs")
    paths = {family: save_model_dir(family, root / family) for family in ("hrm_text", "inkling2_loop", "llama")}
    command = f"retrofit {paths['llama']} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'retrofit'}"
    assert main(command.split()) == 0
    paths["retrofit"] = root / "retrofit"
    return paths


@pytest.fixture(scope="module")
def lms(dirs):
    return {family: open_text_lm(dirs[family]) for family in FAMILIES}


def _generate_json(capsys, path, *flags: str) -> list[dict]:
    """``looplab generate PATH --prompt … --json --dtype float32 FLAGS`` (float32, as the references it is held to):
    the JSON object of each prompt (the summary on stderr)."""
    capsys.readouterr()
    prompts = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    code = main(["generate", str(path), *prompts, "--json", "--max-new-tokens", str(NEW), "--dtype", "float32", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.startswith("generate: ") and err.count("\n") == 1, err
    return [json.loads(line) for line in out.splitlines()]


def _max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_json_generation_at_the_native_loops_is_transformers_generate(dirs, capsys, family):
    """One call on a batch of mixed-length prompts gives, per prompt, transformers' greedy tokens (the
    retrofit's: its source's, which it is at one loop), with their log-probabilities."""
    rows = _generate_json(capsys, dirs[family], "--cache", "per_loop")
    model = _source(dirs["llama" if family == "retrofit" else family])
    model.generation_config.eos_token_id = None  # the tiny tokenizer has no end-of-text token
    assert [row["prompt"] for row in rows] == PROMPTS
    for row in rows:
        assert set(row) == {"prompt", "prompt_ids", "token_ids", "text", "loops", "logprobs"}
        assert row["loops"] == [NATIVE[family]] * NEW and len(row["logprobs"]) == NEW
        ids = torch.tensor([row["prompt_ids"]])
        out = model.generate(
            ids, do_sample=False, max_new_tokens=NEW, output_logits=True, return_dict_in_generate=True, pad_token_id=0
        )
        assert out.sequences[0, ids.shape[1] :].tolist() == row["token_ids"]
        logp = torch.stack(out.logits)[:, 0].double().log_softmax(-1)
        expected = logp[torch.arange(NEW), row["token_ids"]].tolist()
        assert row["logprobs"] == pytest.approx(expected, abs=ATOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cache_equals_recomputation_at_other_loop_counts(dirs, lms, capsys, family):
    """``--cache per_loop`` and ``--cache none`` agree at K = 2 from the command line, and at K = 1, 3, 4 too."""
    cached, recomputed = (
        _generate_json(capsys, dirs[family], "--loops", "2", "--cache", c) for c in ("per_loop", "none")
    )
    assert [row["token_ids"] for row in cached] == [row["token_ids"] for row in recomputed]
    assert _max_gap([r["logprobs"] for r in cached], [r["logprobs"] for r in recomputed]) < ATOL
    for loops in (1, 3, 4):
        rule = GenerationExit("fixed", loops)
        (_, per_loop), (_, none) = (
            generate_text(lms[family], PROMPTS, NEW, DecodeOptions(rule, c)) for c in ("per_loop", "none")
        )
        assert per_loop.tokens == none.tokens, loops
        assert _max_gap(per_loop.logprobs, none.logprobs) < ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_an_adaptive_exit_with_the_per_loop_cache(lms, family):
    """Mixed depths in 1..cap; a batch equals each prompt alone; each row's first new token has the depth
    and log-probability the adapter's own unroll gives its prompt; an eps no step meets is the fixed cap."""
    lm, rule = lms[family], ADAPTIVE[family]
    _, together = generate_text(lm, PROMPTS, NEW, DecodeOptions(rule, "per_loop"))
    depths = {d for row in together.depths for d in row}
    assert depths <= set(range(1, rule.loops + 1)) and len(depths) > 1, together.depths
    for row, prompt in enumerate(PROMPTS):
        _, alone = generate_text(lm, [prompt], NEW, DecodeOptions(rule, "per_loop"))
        assert alone.tokens[0] == together.tokens[row] and alone.depths[0] == together.depths[row]
        assert alone.logprobs[0] == pytest.approx(together.logprobs[row], abs=ATOL)
        depth, logprob = _first_token_reference(lm, lm.encode(prompt), together.tokens[row][0], rule)
        assert together.depths[row][0] == depth and together.logprobs[row][0] == pytest.approx(logprob, abs=ATOL)
    never = replace(rule, params=replace(rule.params, eps=1e-30))
    _, capped = generate_text(lm, PROMPTS, NEW, DecodeOptions(never, "per_loop"))
    _, fixed = generate_text(lm, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", rule.loops), "per_loop"))
    assert capped.tokens == fixed.tokens and {d for row in capped.depths for d in row} == {rule.loops}


def _first_token_reference(lm, prompt: list[int], token: int, rule: GenerationExit) -> tuple[int, float]:
    """The exit depth and log p(token) of a prompt's next token from the adapter's unroll of the prompt alone,
    to the cap: the last position read at its exit depth, the others at the cap (what a coda attends to)."""
    model, valid = lm.model, torch.ones(1, len(prompt), dtype=torch.long)
    with torch.no_grad():
        states = list(model.unroll(torch.tensor([prompt]), valid, rule.loops))
        ctx = model.context(valid)

        def logp(depth: int) -> torch.Tensor:
            read = states[-1].clone()
            read[0, -1] = states[depth - 1][0, -1]
            return model.readout(read, ctx)[0, -1].double().log_softmax(-1)

        last = [h[0, -1] for h in states]
        for t in range(2, rule.loops):
            if rule.name == "kl":
                met = float((logp(t).exp() * (logp(t) - logp(t - 1))).sum()) < rule.params.eps
            else:
                met = float((last[t - 1] - last[t - 2]).norm()) < rule.params.eps * float(last[t - 1].norm())
            if met:
                return t, float(logp(t)[token])
        return rule.loops, float(logp(rule.loops)[token])


@pytest.mark.parametrize("family", FAMILIES)
def test_an_exited_token_lends_every_call_site_its_exit_entries(lms, family):
    """After an adaptive run, a generated token that exited at depth d < cap holds, at every core call site
    (HRM-Text's L passes and H stack, Inkling-2's convolution inputs too) and every loop t in d+1..cap, its
    loop-d entries: what the later tokens that ran deeper read of it."""
    lm, rule = lms[family], ADAPTIVE[family]
    decoder = Decoder(decodable(lm.model), [lm.encode(p) for p in PROMPTS], NEW, DecodeOptions(rule))
    result = decoder.run()
    cache = decoder.cache
    entries = cache.layers
    calls = {key[2] for key in entries if key[0] == "core"}

    def entry(loop, index):  # a stacked call's loop is a view of its stack, made on first read
        return cache.layer("core", loop, index) if index in cache.stacks else entries[("core", loop, index)]

    assert len(calls) >= len(decoder.model.core)
    lent = 0
    for row, depths in enumerate(result.depths):
        for step, depth in enumerate(depths[1:]):  # the token chosen at ``step`` ran in the next forward
            slot = decoder.width + step
            for index in calls:
                for loop in range(depth + 1, rule.loops + 1):
                    own, later = entry(depth, index), entry(loop, index)
                    pairs = [(own.k, later.k), (own.v, later.v)] if hasattr(own, "k") else [(own.values, later.values)]
                    for mine, theirs in pairs:
                        at = (row, slice(None), slot) if mine.dim() == 4 else (row, slot)
                        assert torch.equal(mine[at], theirs[at]) and mine[at].abs().sum() > 0, (index, loop)
                    lent += 1
    assert lent > 0


def test_a_lazy_prompt_gives_hrm_text_what_prefilling_to_the_cap_gives(lms):
    """per_loop with an adaptive exit deepens HRM-Text's prompt on demand (it has no coda): the same tokens,
    depths and log-probabilities as a prompt run to the cap first."""
    model, rule = decodable(lms["hrm_text"].model), ADAPTIVE["hrm_text"]
    prompts = [lms["hrm_text"].encode(p) for p in PROMPTS]
    runs = []
    for lazy in (True, False):
        decoder = Decoder(model, prompts, NEW, DecodeOptions(rule))
        assert decoder.lazy_prompt
        decoder.lazy_prompt = lazy
        runs.append(decoder.run())
    assert runs[0].tokens == runs[1].tokens and runs[0].depths == runs[1].depths
    assert _max_gap(runs[0].logprobs, runs[1].logprobs) < ATOL


@pytest.mark.parametrize("family", ["hrm_text", "inkling2_loop"])
def test_the_shared_and_last_m_caches_run_where_defined(lms, family):
    """At one loop ``shared`` is ``per_loop``; HRM-Text's ``last_m`` keeping the cap's loops is ``per_loop``."""
    lm, one = lms[family], GenerationExit("fixed", 1)
    assert (
        generate_text(lm, PROMPTS, NEW, DecodeOptions(one, "shared"))[1].tokens
        == generate_text(lm, PROMPTS, NEW, DecodeOptions(one))[1].tokens
    )
    if family == "hrm_text":
        three = GenerationExit("fixed", 3)
        kept = generate_text(lm, PROMPTS, NEW, DecodeOptions(three, "last_m", cache_params={"keep_loops": 3}))[1]
        assert kept.tokens == generate_text(lm, PROMPTS, NEW, DecodeOptions(three))[1].tokens


def test_a_row_stops_after_the_models_end_of_text_token(lms):
    lm = lms["retrofit"]
    completions, free = generate_text(lm, PROMPTS, NEW)
    eos = free.tokens[0][1]  # the first prompt's second token, taken as the end of text
    completions, stopped = generate_text(replace(lm, eos=eos), PROMPTS, NEW)
    for row, tokens in enumerate(free.tokens):
        end = tokens.index(eos) + 1 if eos in tokens else NEW
        assert stopped.tokens[row] == tokens[:end]
        assert completions[row].tokens == tokens[:end] and completions[row].text == lm.decode(tokens[:end])


@pytest.mark.parametrize(
    "family, flags, message",
    [
        ("hrm_text", ["--loops", "0"], "loops: must be an integer in 1..4096, got 0"),
        ("hrm_text", ["--loops", "5000"], "loops: must be an integer in 1..4096, got 5000"),
        (
            "hrm_text",
            ["--exit", "nope"],
            "unknown generation exit 'nope'; valid choices: argmax-stability, confidence, convergence",
        ),
        ("hrm_text", ["--exit", "kl", "--exit-param", "eps=-1"], "generate.exits.kl.eps must be in (0, inf)"),
        ("hrm_text", ["--exit", "halting"], "the halting exit needs a halting head, which hrm_text lacks"),
        ("llama", [], "is a llama model, not a looped one: make one of it with `looplab retrofit"),
        ("inkling2_loop", ["--cache", "last_m"], "the last_m cache is not defined for Inkling-2 loop"),
        ("retrofit", ["--cache", "none", "--exit", "convergence"], "use the fixed exit"),
        ("hrm_text", ["--dtype", "float16"], "unknown dtype 'float16'; valid choices: float32, bfloat16"),
        ("hrm_text", ["--max-new-tokens", "0"], "max new tokens must be in 1.."),
        ("retrofit", ["--prompt", ""], "every prompt needs at least one token"),
    ],
)
def test_bad_generate_input_on_a_model_dir_is_one_line(dirs, capsys, family, flags, message):
    capsys.readouterr()
    prompt = [] if "--prompt" in flags else ["--prompt", "And God said"]
    code = main(["generate", str(dirs[family]), *prompt, "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out
    assert message in err and err.count("\n") == 1, err
