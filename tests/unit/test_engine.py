"""The serving engine without HTTP: jobs submitted, stepped, joined mid-decode, cancelled and drained.

Under ``continuous`` batching greedy jobs of one cohort share one decoder and a job that arrives while
others decode joins them at the next step; each job's tokens are those of ``generate`` on its prompt
alone, its log-probabilities within 1e-5 (batched matmuls), its loops the same."""

from __future__ import annotations

import threading

import pytest

from looplab.generation import GenerationExit, Sampling, generate
from looplab.generation.options import DecodeOptions
from looplab.serve.batch import End, Job, Token
from looplab.serve.continuous import ContinuousGroup
from looplab.serve.engine import Engine
from looplab.serve.sampling import Picking
from tests.unit.model_helpers import make_model

PROMPTS = [[1, 5, 4, 2, 6], [1, 3], [1, 6, 6, 4, 5, 2, 6, 3], [1, 6, 2], [1, 4, 4, 4], [1, 5]]
GREEDY = Picking(Sampling())


class Sink:
    """What a job sent: its tokens and how it ended."""

    def __init__(self):
        self.tokens: list[Token] = []
        self.end: End | None = None
        self.closed = threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, Token):
            self.tokens.append(event)
        else:
            self.end = event
            self.closed.set()


def _job(prompt, rule, max_new=6, picking=GREEDY) -> tuple[Job, Sink]:
    sink = Sink()
    return Job(prompt, max_new, DecodeOptions(rule), picking, sink), sink


@pytest.fixture(scope="module")
def model():
    return make_model(causal=True, core_layers=2, max_len=64).eval()


@pytest.fixture(scope="module", params=["looplab", "retrofit"])
def models(request):
    """A byte-model-sized looplab model, and a retrofitted Llama (grouped keys and values, a coda)."""
    if request.param == "looplab":
        return make_model(causal=True, core_layers=2, max_len=64).eval()
    pytest.importorskip("transformers")
    from tests.unit.model_helpers import tiny_llama_retrofit

    return tiny_llama_retrofit().eval()


@pytest.mark.parametrize("rule", [GenerationExit("fixed", 3), GenerationExit("convergence", 6, {"eps": 0.2})])
def test_jobs_arriving_mid_decode_join_the_running_batch_and_decode_as_alone(models, rule):
    model = models
    first = [_job(p, rule) for p in PROMPTS[:3]]
    later = [_job(p, rule, max_new=4) for p in PROMPTS[3:]]
    arrivals = iter([[later[0][0]], [], [later[1][0], later[2][0]]])  # after steps 1, 2 and 3

    def arrive(engine: Engine) -> None:
        jobs = next(arrivals, None)
        if jobs:
            engine.submit(jobs)

    engine = Engine(model, max_running=8, batching="continuous", on_step=arrive)
    engine.submit([job for job, _ in first])
    engine.start()
    for _, sink in first + later:
        assert sink.closed.wait(60)
    engine.close(60)
    groups = engine.stats
    assert groups["joined"] == 3, dict(groups)  # every later job joined the running group
    for job, sink in first + later:
        alone = generate(model, [job.prompt], job.max_new, DecodeOptions(rule))
        assert [t.token for t in sink.tokens] == alone.tokens[0]
        assert [t.depth for t in sink.tokens] == alone.depths[0]
        assert [t.logprob for t in sink.tokens] == pytest.approx(alone.logprobs[0], abs=1e-5)
        assert sink.end == End("length")


def test_a_group_frees_a_finished_row_for_a_newcomer_and_a_cancelled_job_ends(model):
    rule = GenerationExit("fixed", 2)
    (short, short_sink), (long_job, long_sink) = _job(PROMPTS[0], rule, max_new=1), _job(PROMPTS[2], rule, 8)
    group = ContinuousGroup(model, [short, long_job], capacity=2, columns=8)
    group.step()  # the short job's one token: its row is free
    assert short_sink.end == End("length") and group.jobs[0] is None
    newcomer, new_sink = _job(PROMPTS[1], rule, max_new=3)
    assert group.can_take(newcomer)
    group.join(newcomer)
    assert group.jobs[0] is newcomer and not group.can_take(_job(PROMPTS[3], rule)[0])  # no row left
    long_job.cancelled.set()
    while not group.done:
        group.step()
    assert long_sink.end == End("cancelled") and new_sink.end == End("length")
    alone = generate(model, [PROMPTS[1]], 3, DecodeOptions(rule))
    assert [t.token for t in new_sink.tokens] == alone.tokens[0]


def test_a_job_that_does_not_fit_starts_its_own_group(model):
    rule = GenerationExit("fixed", 2)
    group = ContinuousGroup(model, [_job(PROMPTS[1], rule, max_new=2)[0]], capacity=4, columns=8)
    assert not group.can_take(_job(PROMPTS[2], rule)[0])  # a prompt wider than the group's
    assert not group.can_take(_job(PROMPTS[1], GenerationExit("fixed", 3))[0])  # another cohort
    assert not group.can_take(_job(PROMPTS[1], rule, max_new=9)[0])  # a budget past the columns
    sampled = Picking(Sampling(temperature=1.0, seed=3))
    assert not group.can_take(_job(PROMPTS[1], rule, picking=sampled)[0])  # sampled: its own group


def test_a_busy_engines_new_group_has_room_for_the_prompts_and_budgets_it_has_seen(model):
    """Jobs arriving together get a group as wide as the longest recent prompt and as long as twice the largest
    recent budget, so a long prompt arriving mid-decode joins it instead of starting a group of its own (a
    forward pass of its own every step); all decode as alone."""
    rule = GenerationExit("fixed", 2)
    seen, seen_sink = _job(PROMPTS[2], rule, max_new=5)
    shorts = [_job(prompt, rule, max_new=6) for prompt in (PROMPTS[1], PROMPTS[5])]
    wide, wide_sink = _job(PROMPTS[2], rule, max_new=4)
    arrivals = iter([[], [wide]])

    def arrive(engine: Engine) -> None:
        if seen_sink.closed.is_set():
            jobs = next(arrivals, None)
            if jobs:
                engine.submit(jobs)

    engine = Engine(model, max_running=8, on_step=arrive)
    engine.submit([seen])
    engine.start()
    assert seen_sink.closed.wait(60)
    engine.submit([job for job, _ in shorts])
    assert all(sink.closed.wait(60) for _, sink in shorts) and wide_sink.closed.wait(60)
    engine.close(60)
    assert engine.stats["joined"] == 1, dict(engine.stats)
    for job, sink in (*shorts, (wide, wide_sink)):
        assert [t.token for t in sink.tokens] == generate(model, [job.prompt], job.max_new, DecodeOptions(rule)).tokens[
            0
        ]


def test_the_engine_drains_what_it_holds_on_close(model):
    rule = GenerationExit("fixed", 2)
    jobs = [_job(p, rule, max_new=5) for p in PROMPTS]
    engine = Engine(model, max_running=4, batching="continuous")
    engine.submit([job for job, _ in jobs])
    engine.start()
    engine.close(60)  # stops intake, finishes every queued and running job
    assert all(sink.end == End("length") and len(sink.tokens) == 5 for _, sink in jobs)
    assert engine.running == 0 and engine.waiting == 0
