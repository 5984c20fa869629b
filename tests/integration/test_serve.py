"""``looplab serve`` on a tiny byte-level LM: the OpenAI API through the real ``openai`` client and raw HTTP,
results equal to ``generate`` / ``score`` (alone or among concurrent requests), faults, bad requests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from looplab.cli import main
from looplab.config import load_config
from looplab.generation import Sampling, generate, score
from looplab.generation.fields import decode_options
from looplab.generation.options import DecodeOptions
from looplab.generation.text_lm import open_text_lm
from looplab.serve import create_app
from looplab.serve.server import bind
from looplab.train.trainer import train
from tests.integration.test_stars_lm import TINY as TINY_LM

TIMEOUT = 30  # seconds any one request may take here


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("serve") / "lm"
    train(load_config(None, TINY_LM), run_dir, progress=False)
    return run_dir


@pytest.fixture(scope="module")
def lm(lm_run):
    return open_text_lm(lm_run)


@contextmanager
def serving(lm, **options):
    """The app on 127.0.0.1 at a free port, in a thread; yields (base URL, engine)."""
    app = create_app(lm=lm, **options)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.engine
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


@pytest.fixture(scope="module")
def server(lm):
    with serving(lm) as (url, engine):
        yield url, engine


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def reference(lm, prompt: str, max_tokens: int, exit="fixed", loops=None, cache="per_loop", **params):
    return generate(
        lm.model, [lm.encode(prompt)], max_tokens, DecodeOptions(lm.exit_rule(exit, loops, **params), cache)
    )


def test_models_lists_the_model_and_its_defaults(server, lm):
    url, _ = server
    (card,) = client(url).models.list().data
    assert card.id == "lm"
    assert card.looplab["default_loops"] == lm.default_loops
    assert card.looplab["max_context"] == lm.max_context and "kl" in card.looplab["exits"]


@pytest.mark.parametrize(
    "exit, loops, cache, params",
    [("fixed", None, "per_loop", {}), ("kl", 6, "per_loop", {"eps": 0.01}), ("convergence", 6, "shared", {})],
)
def test_a_completion_equals_generate(server, lm, exit, loops, cache, params):
    url, _ = server
    extra = {"exit": exit, "loops": loops, "cache": cache, **params}
    out = client(url).completions.create(
        model="lm", prompt="In the beginning", max_tokens=12, temperature=0, logprobs=1, extra_body=extra
    )
    (choice,) = out.choices
    ref = reference(lm, "In the beginning", 12, exit, loops, cache, **params)
    assert choice.looplab["token_ids"] == ref.tokens[0]
    assert choice.logprobs.token_logprobs == ref.logprobs[0]  # exactly: the same decoder on the same rows
    assert choice.looplab["loops"] == ref.depths[0]
    assert choice.text == lm.decode(ref.tokens[0]) and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 12


def test_usage_counts_the_loops_and_metrics_serve_the_engines_counts(lm):
    """A completion's ``usage.loops`` sums, averages and histograms its tokens' loops (an adaptive exit: they
    differ); ``GET /metrics`` is Prometheus text whose counts are those of the requests answered."""
    extra = {"exit": "kl", "loops": 6, "eps": 1e-7}  # this tiny LM's tokens exit at 2 to 6 loops
    with serving(lm) as (url, engine):
        outs = [
            client(url).completions.create(
                model="lm", prompt=prompt, max_tokens=9, temperature=temperature, seed=5, extra_body=extra
            )
            for prompt, temperature in (("In the beginning", 0), ("And God said", 1.0))
        ]
        scrape = httpx.get(f"{url}/metrics", timeout=TIMEOUT)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    loops = [depth for out in outs for depth in out.choices[0].looplab["loops"]]
    for out in outs:
        depths = out.choices[0].looplab["loops"]
        usage = out.usage.model_extra["loops"]
        assert usage["total"] == sum(depths) and usage["mean"] == pytest.approx(sum(depths) / len(depths))
        assert usage["histogram"] == {str(d): depths.count(d) for d in set(depths)}
    assert len(set(loops)) > 1, "the exit ran every token to one depth: the histogram is not tested"
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scrape.text)
        for sample in family.samples
    }
    assert samples[("looplab_tokens_total", (("kind", "generated"),))] == len(loops) == 18
    assert samples[("looplab_tokens_total", (("kind", "prompt"),))] == sum(out.usage.prompt_tokens for out in outs)
    assert samples[("looplab_jobs_total", (("event", "finished"),))] == 2
    assert samples[("looplab_token_loops_sum", ())] == sum(loops)
    assert samples[("looplab_token_loops_count", ())] == len(loops)
    assert samples[("looplab_token_loops_bucket", (("le", "3.0"),))] == sum(depth <= 3 for depth in loops)
    assert samples[("looplab_jobs_running", ())] == 0 and samples[("looplab_kv_cache_bytes", ())] == 0


def test_streaming_sends_the_same_tokens_one_chunk_at_a_time(server, lm):
    url, _ = server
    args = dict(model="lm", prompt=["k=3;", "And God"], max_tokens=9, temperature=0, logprobs=1)
    whole = client(url).completions.create(**args, extra_body={"exit": "kl", "loops": 6})
    chunks = list(client(url).completions.create(**args, stream=True, extra_body={"exit": "kl", "loops": 6}))
    for index, choice in enumerate(whole.choices):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert "".join(c.text for c in mine) == choice.text
        assert [d for c in mine for d in c.looplab["loops"]] == choice.looplab["loops"]
        assert [lp for c in mine if c.logprobs for lp in c.logprobs.token_logprobs] == choice.logprobs.token_logprobs
        assert [c.finish_reason for c in mine][-1] == "length"


def test_a_stop_string_ends_the_choice_before_it(server, lm):
    url, _ = server
    free = client(url).completions.create(model="lm", prompt="In", max_tokens=20, temperature=0)
    stop = next(ch for ch in free.choices[0].text[2:] if ch != "\ufffd")
    cut = client(url).completions.create(model="lm", prompt="In", max_tokens=20, temperature=0, stop=stop)
    assert cut.choices[0].text == free.choices[0].text[: free.choices[0].text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_echo_with_logprobs_scores_the_prompt_as_score_does(server, lm):
    url, _ = server
    text = "And God said, Let there be light"
    for exit, loops in (("fixed", None), ("kl", 6)):
        out = client(url).completions.create(
            model="lm", prompt=text, max_tokens=0, echo=True, logprobs=1, extra_body={"exit": exit, "loops": loops}
        )
        (choice,) = out.choices
        ref = score(lm.model, [lm.encode(text)], DecodeOptions(lm.exit_rule(exit, loops)))
        assert choice.text == text
        assert choice.logprobs.token_logprobs == [None, *ref.logprobs[0]]
        assert choice.looplab["prompt_loops"] == [None, *ref.depths[0]]


def test_sampling_is_seeded_and_top_p_narrows_it(server):
    url, _ = server
    ask = dict(model="lm", prompt="In", max_tokens=16, temperature=1.0)
    first, again = (client(url).completions.create(**ask, seed=3).choices[0].text for _ in range(2))
    assert first == again
    nucleus = client(url).completions.create(**ask, seed=3, top_p=1e-6).choices[0].text
    greedy = client(url).completions.create(**{**ask, "temperature": 0}).choices[0].text
    assert nucleus == greedy  # the likeliest token alone holds any mass ≤ its own


# -- concurrency -------------------------------------------------------------------------------------------

#: (prompt, max_tokens, looplab fields, temperature): other lengths, budgets, exits, caches and sampling
MIX = [
    ("In the beginning God created", 24, {"exit": "kl", "loops": 6}, 0.0),
    ("k=3;", 5, {"exit": "fixed", "loops": 3}, 0.0),
    ("And the earth was without form, and void", 17, {"exit": "convergence", "loops": 8, "cache": "shared"}, 0.0),
    ("q", 30, {"exit": "fixed", "loops": 2, "cache": "last_m", "keep_loops": 1}, 0.8),
    ("Let there be light", 11, {"exit": "confidence", "loops": 5}, 0.0),
    ("k=7;q=k+1;q?", 20, {"exit": "kl", "loops": 4, "cache": "shared"}, 1.0),
    ("And God saw the light, that it was good", 8, {"exit": "fixed", "loops": 6}, 0.0),
    ("Z", 3, {"exit": "kl", "loops": 8, "eps": 0.1}, 0.0),
]


async def _complete_all(url: str, bodies: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
        replies = await asyncio.gather(*(http.post("/v1/completions", json=body) for body in bodies))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
    return [r.json()["choices"][0] for r in replies]


@pytest.mark.parametrize("batching", ["exact", "cohort", "continuous", "depth"])
def test_results_are_those_of_a_solo_run_among_concurrent_requests(lm, batching):
    """Each request of MIX (greedy, or sampled with its seed), run among all of MIX (joining and leaving the
    decode at other steps), gets the tokens, log-probabilities and loops of ``generate`` on its prompt alone:
    exactly under ``exact`` batching; the same tokens and loops, log-probabilities within 1e-6, under
    ``cohort`` and ``continuous`` (the requests of one cache policy share a decoder, whatever their exits) and
    ``depth`` (the per-loop requests' rows each at their own loop in one core call)."""
    most = []
    bodies = [
        {"prompt": p, "max_tokens": n, "temperature": t, "logprobs": 0, "seed": i, **fields}
        for i, (p, n, fields, t) in enumerate(MIX)
    ]
    with serving(lm, batching=batching, on_step=lambda engine: most.append(engine.running)) as (url, _):
        solo = asyncio.run(_complete_all(url, bodies[:1]))[0]
        together = asyncio.run(_complete_all(url, bodies))
    assert max(most) >= 4, "the requests did not overlap"
    assert together[0]["looplab"] == solo["looplab"]
    if batching == "exact":
        assert together[0]["logprobs"] == solo["logprobs"]
    for seed, ((prompt, budget, fields, temperature), choice) in enumerate(zip(MIX, together)):
        sampling = Sampling(temperature, seed=seed)  # a sampled request draws as generate does with its seed
        ref = generate(lm.model, [lm.encode(prompt)], budget, decode_options(fields, lm, sampling))
        assert choice["looplab"]["token_ids"] == ref.tokens[0]
        assert choice["looplab"]["loops"] == ref.depths[0]
        got = choice["logprobs"]["token_logprobs"]
        if batching == "exact":
            assert got == ref.logprobs[0]
        else:
            assert max(abs(a - b) for a, b in zip(got, ref.logprobs[0])) < 1e-6


#: (prompt, max_tokens, decode fields): each decoder the engine does not step, among stepped requests
WHOLE = [
    ("In the beginning God created", 14, {"decoder": "depth", "exit": "kl", "loops": 6, "max_batch": 1}),
    ("k=3;", 9, {"decoder": "wavefront", "exit": "convergence", "loops": 5}),
    ("And God said", 12, {"decoder": "speculative", "loops": 6, "draft_loops": 2, "draft_tokens": 3}),
    ("Let there be light", 7, {"decoder": "recompute", "loops": 3, "cache": "none"}),
]


def test_every_other_decoder_is_served_whole_with_generates_results(lm):
    """A request naming a decoder the engine does not step runs whole, alone, among stepped requests: its
    tokens, loops and log-probabilities are exactly ``generate``'s with the same decoder, streamed or not;
    its echoed prompt is scored by that decoder as ``score`` scores it."""
    bodies = [{"prompt": p, "max_tokens": n, "temperature": 0, "logprobs": 0, **f} for p, n, f in WHOLE]
    stepped = [{"prompt": p, "max_tokens": n, "temperature": t, **f} for p, n, f, t in MIX]
    with serving(lm) as (url, _):
        together = asyncio.run(_complete_all(url, bodies + stepped))[: len(bodies)]
        streamed = list(
            client(url).completions.create(
                model="lm", prompt=WHOLE[0][0], max_tokens=WHOLE[0][1], temperature=0, stream=True,
                extra_body=WHOLE[0][2],
            )
        )  # fmt: skip
        echoed = client(url).completions.create(
            model="lm", prompt=WHOLE[0][0], max_tokens=0, echo=True, logprobs=0, extra_body=WHOLE[0][2]
        )
    for (prompt, budget, fields), choice in zip(WHOLE, together):
        ref = generate(lm.model, [lm.encode(prompt)], budget, decode_options(fields, lm, Sampling()))
        assert choice["looplab"]["token_ids"] == ref.tokens[0], fields["decoder"]
        assert choice["looplab"]["loops"] == ref.depths[0]
        assert choice["logprobs"]["token_logprobs"] == ref.logprobs[0]
    assert "".join(c.choices[0].text for c in streamed) == together[0]["text"]
    options = decode_options(WHOLE[0][2], lm, Sampling())
    ref = score(lm.model, [lm.encode(WHOLE[0][0])], options)
    assert echoed.choices[0].logprobs.token_logprobs == [None, *ref.logprobs[0]]


def test_a_client_that_disconnects_mid_stream_frees_its_slot(lm):
    with serving(lm, max_running=1, on_step=lambda _: time.sleep(0.002)) as (url, engine):
        body = {"prompt": "In", "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")
        deadline = time.monotonic() + TIMEOUT
        while engine.stats["cancelled"] == 0:
            assert time.monotonic() < deadline, "the abandoned request kept its slot"
            time.sleep(0.01)
        assert engine.running == 0 and engine.stats["finished"] == 0  # cancelled long before its 400 tokens
        after = client(url).completions.create(model="lm", prompt="In", max_tokens=3, temperature=0)
        assert len(after.choices[0].looplab["token_ids"]) == 3


def test_a_full_queue_answers_503_and_the_server_goes_on(lm):
    with serving(lm, max_running=1, max_queue=1, on_step=lambda _: time.sleep(0.005)) as (url, engine):
        long = {"prompt": "In", "max_tokens": 300, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=TIMEOUT) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # admitted: it holds the one slot
            queued = threading.Thread(
                target=httpx.post, args=(f"{url}/v1/completions",), kwargs={"json": {"prompt": "k", "max_tokens": 2},
                                                                            "timeout": TIMEOUT}
            )  # fmt: skip
            queued.start()
            deadline = time.monotonic() + TIMEOUT
            while engine.waiting == 0:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            with pytest.raises(openai.APIStatusError) as refused:
                client(url).completions.create(model="lm", prompt="k", max_tokens=2)
            assert refused.value.status_code == 503 and "busy" in refused.value.message
        queued.join(TIMEOUT)
        assert client(url).completions.create(model="lm", prompt="k", max_tokens=2).choices[0].text is not None


def test_a_plugin_decoders_bad_answer_is_a_json_500_naming_it_and_the_server_goes_on(lm):
    from looplab.generation.decoders import DECODERS, DecodingMethod, register_decoder
    from looplab.generation.sampling import Generation

    @register_decoder
    class Liar(DecodingMethod):
        name = "liar"

        def decode(self, model, prompts, max_new_tokens, options, finished, forced):
            return Generation([[10**6]] * len(prompts), [[1]] * len(prompts), [[-0.5]] * len(prompts))

    try:
        with serving(lm) as (url, _):
            body = {"prompt": "In", "max_tokens": 2, "temperature": 0, "decoder": "liar"}
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT)
            assert reply.status_code == 500
            message = reply.json()["error"]["message"]
            assert "decoder 'liar' (" in message and "token 1000000 in row 0, outside the vocabulary" in message
            assert "\n" not in message
            after = client(url).completions.create(model="lm", prompt="In", max_tokens=2, temperature=0)
            assert len(after.choices[0].looplab["token_ids"]) == 2
    finally:
        del DECODERS["liar"]


def test_a_request_larger_than_the_queue_is_a_400_not_a_503_forever(lm):
    with serving(lm, max_running=2, max_queue=4) as (url, _):
        with pytest.raises(openai.BadRequestError) as refused:
            client(url).completions.create(model="lm", prompt=["a", "b", "c", "d", "e", "f"], max_tokens=2)
        assert "6 completions (prompts × n), more than the server ever queues (--max-queue 4)" in str(refused.value)
        assert len(client(url).completions.create(model="lm", prompt=["a"] * 4, max_tokens=2).choices) == 4


def _kv_bytes(lm, prompt: str, max_tokens: int, loops: int) -> int:
    """The KV bytes one greedy request's paged blocks hold alone, with the pool's null block (the engine's
    ledger's reckoning)."""
    from looplab.serve.batch import Job
    from looplab.serve.ledger import paged_job_bytes
    from looplab.serve.sampling import Picking

    options = decode_options({"exit": "fixed", "loops": loops}, lm, Sampling())
    return paged_job_bytes(lm.model, Job(lm.encode(prompt), max_tokens, options, Picking(Sampling()), print))


def test_under_a_kv_memory_half_of_what_the_load_needs_every_request_waits_its_turn_and_decodes_as_alone(lm):
    """32 concurrent requests under ``kv_memory`` half of what they hold together: every one is answered (those
    whose blocks the pool cannot give wait in the queue, ``deferred``, or are preempted and recomputed), each
    equal to the same request alone, the preemptions counted in ``/metrics``, and the KV memory reserved never
    exceeds the limit."""
    prompts = [("In the beginning " * (1 + i % 3))[: 8 + i] for i in range(32)]
    bodies = [{"prompt": p, "max_tokens": 10, "temperature": 0, "loops": 3} for p in prompts]
    limit = sum(_kv_bytes(lm, p, 10, 3) for p in prompts) // 2
    reserved = []
    with serving(lm, kv_memory=limit, on_step=lambda engine: reserved.append(engine.ledger.reserved)) as (url, eng):
        together = asyncio.run(_complete_all(url, bodies))
        stats = dict(eng.stats)
        scrape = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    assert stats["deferred"] + stats["preempted"] > 0 and stats["finished"] == 32, stats
    assert f'looplab_jobs_total{{event="preempted"}} {float(stats["preempted"])}' in scrape
    assert max(reserved) <= limit
    for prompt, choice in zip(prompts, together):
        ref = reference(lm, prompt, 10, loops=3)
        assert choice["looplab"]["token_ids"] == ref.tokens[0]


def test_a_request_that_could_never_fit_the_kv_memory_is_a_400_naming_the_limit(lm):
    limit = _kv_bytes(lm, "In the beginning", 8, 4)  # one such request fits; twice its slots never do
    at_four = {"exit": "fixed", "loops": 4}
    with serving(lm, kv_memory=limit) as (url, _):
        with pytest.raises(openai.BadRequestError) as refused:
            client(url).completions.create(
                model="lm", prompt="In the beginning", max_tokens=40, temperature=0, extra_body=at_four
            )
        assert "needs" in str(refused.value) and "MiB of KV memory, more than the server holds" in str(refused.value)
        out = client(url).completions.create(
            model="lm", prompt="In the beginning", max_tokens=8, temperature=0, extra_body=at_four
        )
        assert out.usage.completion_tokens == 8  # the server goes on


# -- bad requests ------------------------------------------------------------------------------------------

#: (request fields, the field the 400 names, a fragment of its message): through the openai client
BAD = [
    ({"extra_body": {"exit": "nope"}}, "exit", "valid choices: argmax-stability, confidence, convergence, cosine"),
    ({"extra_body": {"cache": "huge"}}, "cache", "valid choices: last_m, none, per_loop, shared"),
    ({"extra_body": {"decoder": "nope"}}, "decoder", "valid choices: depth, recompute, speculative, step, wavefront"),
    ({"top_p": 0.5, "extra_body": {"decoder": "depth"}}, "top_p", "the depth decoder takes top_p 1"),
    ({"logprobs": 2, "extra_body": {"decoder": "depth"}}, "logprobs", "ask logprobs 0, or decoder step"),
    (
        {"prompt": "In the", "echo": True, "logprobs": 0, "temperature": 0, "extra_body": {"decoder": "wavefront"}},
        "request",
        "the wavefront decoder picks its own tokens; teacher-forced scoring takes one of",
    ),
    ({"temperature": 0.7, "extra_body": {"decoder": "speculative"}}, "decoder", "the speculative decoder is greedy"),
    (
        {"extra_body": {"decoder": "step", "max_batch": 2}},
        "max_batch",
        "a parameter of the depth decoder; this request",
    ),
    ({"max_tokens": -1}, "max_tokens", "≥ 0"),
    ({"max_tokens": 600}, "max_tokens", "context of 512"),
    ({"prompt": "a" * 600}, "prompt", "longer than the model's context of 512"),
    ({"extra_body": {"loops": 5000}}, "loops", "must be an integer in 1..4096, got 5000"),
    ({"extra_body": {"loops": 0}}, "loops", "must be an integer in 1..4096, got 0"),
    ({"extra_body": {"exit": "halting"}}, "exit", "needs a halting head"),
    (
        {"extra_body": {"exit": "fixed", "eps": 0.1}},
        "eps",
        "a parameter of the convergence, kl, latent-diff, cosine, entropy-diff and minp-kl exits",
    ),
    ({"extra_body": {"exit": "kl", "eps": -1.0}}, "eps", "eps"),
    ({"temperature": -0.5}, "temperature", "≥ 0.0"),
    ({"top_p": 0.0}, "top_p", "(0.0, 1.0]"),
    ({"top_p": 1.5}, "top_p", "(0.0, 1.0]"),
    ({"extra_body": {"top_k": -2}}, "top_k", "≥ 0"),
    ({"logprobs": 50}, "logprobs", "[0, 20]"),
    ({"n": 2}, "n", "only n = 1"),
    ({"model": "gpt-4"}, "model", "valid choices: lm"),
    ({"stop": ""}, "stop", "non-empty"),
    ({"prompt": [[1, 99999]]}, "prompt", "outside the vocabulary"),
    ({"extra_body": {"keep_loops": 0, "cache": "last_m"}}, "keep_loops", "[1, 4096]"),
    (
        {"extra_body": {"keep_loops": 4}},
        "keep_loops",
        "a parameter of the last_m cache; this request chooses exit fixed, cache per_loop",
    ),
    ({"extra_body": {"seed": 2**64}}, "seed", "[0, 9223372036854775807]"),
    ({"extra_body": {"seed": -1}}, "seed", "[0, 9223372036854775807]"),
    ({"prompt": ["In"] * 97}, "prompt", "97 prompts in one request, more than this server ever holds at once"),
    ({"max_tokens": 400, "extra_body": {"loops": 4096}}, "loops", "token-loops, more than the 1,048,576 one"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate", "unknown field; valid fields: model, prompt"),
]

#: (raw body, the field named, a fragment): wrong JSON types and malformed JSON, through raw HTTP
BAD_RAW = [
    (b'{"prompt": "In", "max_tokens": ', "body", "not valid JSON"),
    (b"[1, 2]", "body", "JSON object"),
    (b"", "body", "JSON object"),
    (b'{"max_tokens": 2}', "prompt", "required"),
    (b'{"prompt": 7}', "prompt", "a string, a list of strings"),
    (b'{"prompt": "In", "max_tokens": "5"}', "max_tokens", "must be an integer, got a string"),
    (b'{"prompt": "In", "max_tokens": 2.5}', "max_tokens", "must be an integer, got a number"),
    (b'{"prompt": "In", "temperature": "hot"}', "temperature", "must be a number"),
    (b'{"prompt": "In", "stream": "yes"}', "stream", "true or false"),
    (b'{"prompt": "In", "loops": true}', "loops", "must be an integer in 1..4096, got True"),
    (b'{"prompt": "In", "exit": 3}', "exit", "must be a name (a string), got 3"),
    (b'{"prompt": ["In", 3]}', "prompt", "each prompt"),
    (b'\xff\xfe{"prompt"', "body", "not valid JSON"),
    (b'{"prompt": "In", "temperature": NaN}', "temperature", "must be a finite number, got nan"),
    (b'{"prompt": "In", "temperature": Infinity}', "temperature", "must be a finite number, got inf"),
    (b'{"prompt": "In", "temperature": 1e400}', "temperature", "must be a finite number, got inf"),
    (b'{"prompt": "In", "top_p": NaN}', "top_p", "must be a finite number"),
    (b"[" * 100_000, "body", "nested too deeply"),
    (b'{"prompt": "In \\ud800 the"}', "prompt", "not valid Unicode text (a lone surrogate at character 3)"),
    (b'{"prompt": "' + b"a" * (5 * 2**20) + b'"}', "body", "larger than the 4 MiB a request may send"),
]


@pytest.mark.parametrize("fields, field, fragment", BAD, ids=[case[1] for case in BAD])
def test_a_bad_request_is_a_400_naming_the_field(server, fields, field, fragment):
    url, _ = server
    ask = {"model": "lm", "prompt": "In", "max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client(url).completions.create(**ask)
    error = refused.value.body
    assert error["param"] == field and error["message"].startswith(f"{field}: ") and fragment in error["message"]
    assert "\n" not in error["message"]
    assert client(url).completions.create(model="lm", prompt="In", max_tokens=1).usage.completion_tokens == 1


@pytest.mark.parametrize("body, field, fragment", BAD_RAW, ids=[f"raw-{i}" for i in range(len(BAD_RAW))])
def test_a_malformed_body_is_a_400_naming_the_field(server, body, field, fragment):
    url, _ = server
    reply = httpx.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and fragment in error["message"] and "\n" not in error["message"]
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


@pytest.mark.parametrize("method, route", [("POST", "/v1/chat/completions"), ("GET", "/v1/models/lm"),
                                           ("POST", "/v1/embeddings"), ("GET", "/v1/completions")])  # fmt: skip
def test_an_unserved_route_answers_openais_error_object(server, method, route):
    url, _ = server
    reply = httpx.request(method, f"{url}{route}", json={"model": "lm"})
    assert reply.status_code in (404, 405)
    error = reply.json()["error"]
    assert f"{method} {route} is not served" in error["message"] and "POST /v1/completions" in error["message"]
    if "chat" in route:
        assert "send the prompt to POST /v1/completions" in error["message"]
    with pytest.raises(openai.NotFoundError, match="is not served"):
        client(url).chat.completions.create(model="lm", messages=[{"role": "user", "content": "In"}])


def test_a_plugin_exits_own_parameter_is_a_field(server, lm, monkeypatch):
    _register_top_margin(monkeypatch)

    url, _ = server
    extra = {"exit": "top_margin", "loops": 8, "margin": 0.5}
    out = client(url).completions.create(model="lm", prompt="In the", max_tokens=6, temperature=0, extra_body=extra)
    ref = reference(lm, "In the", 6, "top_margin", 8, margin=0.5)
    assert out.choices[0].looplab["token_ids"] == ref.tokens[0] and out.choices[0].looplab["loops"] == ref.depths[0]
    with pytest.raises(openai.BadRequestError, match="margin: generate.exits.top_margin.margin must be in"):
        client(url).completions.create(model="lm", prompt="In", max_tokens=2, extra_body={**extra, "margin": -1})


def test_every_likeliest_token_is_listed_even_where_texts_collide(server):
    url, _ = server
    out = client(url).completions.create(model="lm", prompt="In", max_tokens=12, temperature=0, logprobs=5)
    tops = out.choices[0].logprobs.top_logprobs
    assert len(tops) == 12 and all(len(top) == 5 for top in tops)


def test_unseeded_samples_differ_and_say_their_seed(server):
    url, _ = server
    ask = dict(model="lm", prompt="In", max_tokens=16, temperature=1.0)
    replies = [client(url).completions.create(**ask) for _ in range(4)]
    seeds = [reply.looplab["seed"] for reply in replies]
    assert len(set(seeds)) == 4 and len({reply.choices[0].text for reply in replies}) > 1
    again = client(url).completions.create(**ask, seed=seeds[0])
    assert again.choices[0].text == replies[0].choices[0].text and again.looplab["seed"] == seeds[0]


# -- the command -------------------------------------------------------------------------------------------


def _start(lm_run, *flags) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "looplab", "serve", str(lm_run), "--port", "0", *flags]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    memory = proc.stderr.readline()  # what a request's KV cache takes, against the KV memory
    assert memory.startswith("serve: a request's KV cache at 2 loops (per_loop) takes") and "the KV memory" in memory
    line = proc.stderr.readline()
    assert " on http://127.0.0.1:" in line, line
    return proc, line.split(" on ")[1].split("/v1")[0]


def test_sigterm_finishes_the_requests_in_flight_then_exits_0(lm_run):
    proc, url = _start(lm_run)
    try:
        body = {"prompt": "In", "max_tokens": 100, "temperature": 0, "stream": True, "loops": 16}
        events = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as reply:
            lines = reply.iter_lines()
            events.append(next(lines))
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            events += [line for line in lines if line]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e[6:]) for e in events[:-1]]
        assert sum(len(c["choices"][0]["looplab"]["token_ids"]) for c in chunks) == 100
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        with pytest.raises(httpx.TransportError):  # the socket is closed: no new requests
            httpx.post(f"{url}/v1/completions", json={"prompt": "In", "max_tokens": 1}, timeout=5)
        assert proc.wait(TIMEOUT) == 0
        assert time.monotonic() - signalled < TIMEOUT
        assert "shutting down" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_second_ctrl_c_ends_the_requests_in_flight_cleanly(lm_run):
    """Two long requests, then Ctrl-C twice: each is answered (HTTP 200, what it had, finish_reason
    ``cancelled``), the process exits 0, and its log holds no traceback."""
    proc, url = _start(lm_run)
    try:
        body = {"prompt": "In", "max_tokens": 400, "temperature": 0, "loops": 512}  # seconds a request
        replies: list = []
        threads = [
            threading.Thread(target=lambda: replies.append(httpx.post(f"{url}/v1/completions", json=body,
                                                                      timeout=TIMEOUT)))
            for _ in range(2)
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + TIMEOUT
        while httpx.get(f"{url}/health", timeout=5).json()["running"] < 2:
            assert time.monotonic() < deadline, "the two requests did not start"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        for thread in threads:
            thread.join(TIMEOUT)
        assert [reply.status_code for reply in replies] == [200, 200]
        for reply in replies:
            choice = reply.json()["choices"][0]
            assert choice["finish_reason"] == "cancelled" and 0 < len(choice["looplab"]["token_ids"]) < 400
        assert proc.wait(TIMEOUT) == 0
        log = proc.stderr.read()
        assert "Traceback" not in log and "ending the requests in flight now" in log, log
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--replicas", "0"], "--replicas must be ≥ 1"),
        (["--max-running", "0"], "max running must be ≥ 1"),
        (["--port", "70000"], "--port must be in 0..65535"),
        (["--batching", "fast"], "invalid choice"),
        (["--max-queue", "0"], "--max-queue must be ≥ 1 (a queue of 0 refuses every request), got 0"),
        (["--max-token-loops", "0"], "--max-token-loops must be ≥ 1, got 0"),
        (["--kv-memory", "0"], "--kv-memory must be a positive number of GiB, got 0.0"),
        (["--kv-memory", "nan"], "--kv-memory must be a positive number of GiB, got nan"),
        (["--kv-memory", "lots"], "argument --kv-memory: invalid float value: 'lots'"),
        (["--prefix-cache", "-1"], "--prefix-cache must be a number of GiB ≥ 0 (0: off), got -1.0"),
        (["--kv-memory", "1e-7", "--port", "0"], "holds no request: one prompt token and one new token at"),
        (["--device", "cuda:7"], "--device = 'cuda:7', but this machine has"),
        (["--dtype", "bfloat16"], "--dtype applies to a model dir (config.json)"),
        (["--ray-address", "127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
    ],
)
def test_bad_serve_flags_are_one_line_errors(lm_run, flags, message, capsys):
    assert main(["serve", str(lm_run), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def _register_top_margin(monkeypatch) -> None:
    """The example plugin exit ``top_margin`` in the registry for this test, as a run's plugins would put it
    (other tests take plugin entries out of the registry again, so the import alone is not enough)."""
    from looplab.examples.plugins.top_margin import TopMargin, top_margin
    from looplab.token_exits import EXITS, TokenExit

    monkeypatch.setitem(EXITS, "top_margin", TokenExit("top_margin", True, 1, top_margin, params=TopMargin))
