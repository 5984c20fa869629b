"""The serving engine without HTTP: jobs submitted, stepped, joined mid-decode, cancelled and drained.

Under ``continuous`` batching greedy jobs of one cohort share one decoder and a job that arrives while
others decode joins them at the next step; each job's tokens are those of ``generate`` on its prompt
alone, its log-probabilities within 1e-5 (batched matmuls), its loops the same."""

from __future__ import annotations

import threading

import pytest
import torch

from looplab.generation import GenerationExit, Sampling, generate
from looplab.generation.options import DecodeOptions
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from looplab.serve.batch import End, Job, Token
from looplab.serve.continuous_group import ContinuousGroup
from looplab.serve.depth_group import DepthGroup
from looplab.serve.engine import Engine
from looplab.serve.runner import group_state
from looplab.serve.sampling import Picking
from looplab.serve.speculative_group import SpeculativeGroup
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


def _can_take(group, job: Job) -> bool:
    """Whether the scheduler would let ``job`` join ``group``, from the state the runner reports of it."""
    return group_state(0, group).can_take(job, group.cohort_of(job))


def _deliver(*jobs: Job) -> None:
    """Hand what each job's group sent to its sink, as the engine's scheduler does (a group driven here alone)."""
    for job in jobs:
        for event in job.outbox:
            job.sink(event)
        job.outbox.clear()


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


def test_an_idle_engine_takes_a_burst_of_jobs_in_its_first_step(model):
    """Jobs sent 10 ms apart to an idle engine whose steps cost enough that waiting for them pays (a recent step
    of 100 s: it waits up to its gather limit, here 0.5 s, for each next one) are admitted together in its
    first step, prefilled in one group, none joining it later; each decodes as alone."""
    import time

    rule = GenerationExit("fixed", 3)
    jobs = [_job(prompt, rule) for prompt in PROMPTS[:4]]
    firsts = []
    engine = Engine(model, max_running=8, on_step=lambda engine: firsts.append(engine.stats["admitted"]))
    engine.step_seconds.append(100.0)
    engine.gather_max = 0.5
    engine.start()
    for job, _ in jobs:
        engine.submit([job])
        time.sleep(0.01)
    assert all(sink.closed.wait(60) for _, sink in jobs)
    engine.close(60)
    assert firsts[0] == 4 and engine.stats["joined"] == 0, (firsts, dict(engine.stats))
    for job, sink in jobs:
        assert [t.token for t in sink.tokens] == generate(model, [job.prompt], 6, DecodeOptions(rule)).tokens[0]


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
    group.begin()
    group.step()  # the short job's one token: its row is free
    _deliver(short, long_job)
    assert short_sink.end == End("length") and group.jobs[0] is None
    newcomer, new_sink = _job(PROMPTS[1], rule, max_new=3)
    assert _can_take(group, newcomer)
    group.join([newcomer])
    assert group.jobs[0] is newcomer and not _can_take(group, _job(PROMPTS[3], rule)[0])  # no row left
    long_job.cancelled.set()
    while not group.done:
        group.step()
    _deliver(long_job, newcomer)
    assert long_sink.end == End("cancelled") and new_sink.end == End("length")
    alone = generate(model, [PROMPTS[1]], 3, DecodeOptions(rule))
    assert [t.token for t in new_sink.tokens] == alone.tokens[0]


def test_a_job_that_does_not_fit_starts_its_own_group(model):
    rule = GenerationExit("fixed", 2)
    group = ContinuousGroup(model, [_job(PROMPTS[1], rule, max_new=2)[0]], capacity=4, columns=8)
    assert not _can_take(group, _job(PROMPTS[2], rule)[0])  # a prompt wider than the group's
    assert not _can_take(group, _job(PROMPTS[1], GenerationExit("fixed", 3))[0])  # another cohort
    assert not _can_take(group, _job(PROMPTS[1], rule, max_new=9)[0])  # a budget past the columns
    sampled = Picking(Sampling(temperature=1.0, seed=3))
    assert _can_take(group, _job(PROMPTS[1], rule, picking=sampled)[0])  # sampled rows share the group


#: each job's picking: greedy, sampled at temperature 1 (OpenAI's default), top-k, nucleus, and a scoring job
PICKINGS = [
    GREEDY,
    Picking(Sampling(temperature=1.0, seed=11)),
    Picking(Sampling(temperature=0.7, top_k=3, seed=12)),
    Picking(Sampling(temperature=1.3, seed=13), top_p=0.8),
    Picking(Sampling(temperature=1.0, seed=14)),
    "score",
]


def _mixed_jobs(rules) -> list[tuple[Job, Sink]]:
    """A job of each of PROMPTS, picked by PICKINGS, stopping by ``rules`` in turn."""
    jobs = []
    for index, (prompt, picking) in enumerate(zip(PROMPTS, PICKINGS, strict=True)):
        rule, sink = rules[index % len(rules)], Sink()
        if picking == "score":  # the prompt teacher-forced, as a server's echo with logprobs scores it
            jobs.append((Job(prompt[:1], len(prompt) - 1, DecodeOptions(rule), GREEDY, sink, forced=prompt[1:]), sink))
        else:
            jobs.append((Job(prompt, 7, DecodeOptions(rule), picking, sink), sink))
    return jobs


def _run(jobs: list[tuple[Job, Sink]], model, batching: str, arrivals=()) -> Engine:
    """The engine's run of ``jobs``, ``arrivals`` submitted after its first steps; its ``groups``: the most
    groups that ran at once, and their ``kinds``."""
    arriving = iter(arrivals)

    def arrive(engine: Engine) -> None:
        engine.groups = max(getattr(engine, "groups", 0), len(engine.runner.groups))
        engine.kinds = getattr(engine, "kinds", set()) | {type(group) for group in engine.runner.groups.values()}
        jobs = next(arriving, None)
        if jobs:
            engine.submit(jobs)

    engine = Engine(model, max_running=8, batching=batching, on_step=arrive)
    waiting = {id(job) for batch in arrivals for job in batch}
    engine.submit([job for job, _ in jobs if id(job) not in waiting])
    engine.start()
    assert all(sink.closed.wait(60) for _, sink in jobs)
    engine.close(60)
    return engine


def _assert_as_alone(sink: Sink, solo: Sink) -> None:
    """A job's tokens and loops are those it got alone, its log-probabilities within 1e-5."""
    assert [t.token for t in sink.tokens] == [t.token for t in solo.tokens]
    assert [t.depth for t in sink.tokens] == [t.depth for t in solo.tokens]
    assert [t.logprob for t in sink.tokens] == pytest.approx([t.logprob for t in solo.tokens], abs=1e-5)


MIXED_EXITS = [
    GenerationExit("fixed", 3),
    GenerationExit("convergence", 6, {"eps": 0.2}),
    GenerationExit("kl", 5, {"eps": 0.05}),
    GenerationExit("fixed", 1),
]
#: exits that carry state across a token's checks, two caps and counts, beside one that carries none
CARRYING_EXITS = [
    GenerationExit("argmax-stability", 6, {"steps": 1}),
    GenerationExit("argmax-stability", 4, {"steps": 2}),
    GenerationExit("convergence", 6, {"eps": 0.2}),
]


@pytest.mark.parametrize(
    "rules",
    [[GenerationExit("fixed", 3)], [GenerationExit("convergence", 6, {"eps": 0.2})], MIXED_EXITS, CARRYING_EXITS],
    ids=["fixed", "convergence", "mixed-exits", "carrying-exits"],
)
def test_every_job_of_a_cache_policy_shares_one_forward_and_decodes_as_alone(models, rules):
    """Greedy, seeded sampled (temperature, top-k, top-p) and scoring jobs, at one exit or at four exits and
    loop caps, three of them arriving mid-decode, run as rows of one group: each row's tokens and loops are
    those of the job decoded alone (``exact`` batching: one decoder each, bit for bit ``generate``), its
    log-probabilities within 1e-5."""
    model = models
    shared = _mixed_jobs(rules)
    engine = _run(shared, model, "continuous", arrivals=[[shared[3][0]], [], [shared[4][0], shared[5][0]]])
    assert engine.stats["joined"] == 3 and engine.groups == 1, dict(engine.stats)
    alone = _mixed_jobs(rules)
    _run(alone, model, "exact")
    for (job, sink), (_, solo) in zip(shared, alone, strict=True):
        _assert_as_alone(sink, solo)
        if job.forced is not None:
            assert [t.token for t in sink.tokens] == job.forced
        elif job.picking.top_p == 1:  # the engine's picking is generate's: the same seed draws the same tokens
            options = DecodeOptions(job.options.exit_rule, sampling=job.picking.sampling)
            assert [t.token for t in sink.tokens] == generate(model, [job.prompt], 7, options).tokens[0]
    sampled = [[t.token for t in sink.tokens] for job, sink in shared if job.generator is not None]
    assert len({tuple(tokens) for tokens in sampled}) == len(sampled)  # each drew from its own generator


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


def _prefixed_jobs(rules, picking=GREEDY) -> list[tuple[Job, Sink]]:
    """Jobs whose prompts share a 32-token (two-block) prefix, then differ; one shares only its first block."""
    shared = [1, *(2 + (7 * i) % 5 for i in range(31))]
    tails = [[3, 4], [5], [6, 2, 3, 4, 5], [4, 4, 4]]
    prompts = [shared + tail for tail in tails] + [shared[:16] + [6] * 17]
    jobs = []
    for index, prompt in enumerate(prompts):
        sink = Sink()
        jobs.append((Job(prompt, 5, DecodeOptions(rules[index % len(rules)]), picking, sink), sink))
    return jobs


#: three exits at one cap: a prefix kept under one is read under the others (per_loop: the same keys and values)
ONE_CAP = [GenerationExit("fixed", 3), GenerationExit("kl", 3, {"eps": 0.05}), GenerationExit("convergence", 3)]


@pytest.mark.parametrize("rules", [[GenerationExit("fixed", 3)], ONE_CAP], ids=["fixed", "three-exits"])
def test_a_kept_prompt_prefix_is_reused_and_each_job_decodes_as_alone(models, rules):
    """Jobs whose prompts begin alike, arriving together and later: the first prompt's whole blocks are kept
    and the others copy them and prefill only the rest (the store serves every shared block: three prompts'
    two and one prompt's one); each job's tokens and loops are those of the job alone, its log-probabilities
    within 1e-5."""
    model = models
    shared = _prefixed_jobs(rules)
    engine = _run(shared, model, "continuous", arrivals=[[shared[3][0]], [shared[4][0]]])
    store = engine.prefixes
    assert store.served == 3 * 32 + 16 and store.asked == 5 * 32, (store.served, store.asked)  # the first: none
    alone = _prefixed_jobs(rules)
    _run(alone, model, "exact")
    for (_, sink), (_, solo) in zip(shared, alone, strict=True):
        _assert_as_alone(sink, solo)
    assert engine.ledger.reserved == store.nbytes > 0  # the groups gave their bytes back; the kept blocks hold theirs


def test_a_full_batch_stepped_in_another_row_order_reads_each_rows_own_cache(model):
    """A server's batch holds its rows in the order they joined: a step of every row given in another order
    gives each row the logits it gets in order (its own cache rows, not another's)."""
    options = DecodeOptions(GenerationExit("fixed", 2))
    logits = []
    for order in ([0, 1, 2], [2, 0, 1]):
        decoder = Decoder(model, PROMPTS[:3], 4, options)
        rows = torch.tensor(order)
        first, _ = decoder.prefill(rows)
        step, _ = decoder.step(rows, first.argmax(-1), decoder.width, decoder.lengths[rows])
        logits.append(step[torch.tensor(order).argsort()])
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_a_job_waiting_for_kv_memory_whose_client_leaves_ends_cancelled_and_the_rest_go_on(model, paged):
    """Under a KV memory that holds one job at a time the others wait (deferred): a dense group's reserved
    whole, or, paged, a prompt whose blocks the pool cannot give beside another's. One cancelled while it
    waits ends ``cancelled`` without running, the others decode as alone, and every reserved byte is given
    back."""
    from looplab.serve.ledger import job_bytes, paged_job_bytes

    rule = GenerationExit("fixed", 2)
    # paged, a prompt of 3 blocks: two take more than the pool one job may need alone (5 blocks a layer call)
    prompts = [prompt * 8 for prompt in PROMPTS[:3]] if paged else PROMPTS[:3]
    jobs = [_job(p[:40], rule, max_new=4) for p in prompts]
    limit = max((paged_job_bytes if paged else job_bytes)(model, job) for job, _ in jobs)

    def leave(engine: Engine) -> None:
        if engine.stats["deferred"]:
            jobs[2][0].cancelled.set()  # its client leaves while it waits

    engine = Engine(model, max_running=8, kv_memory=limit, prefix_memory=0, on_step=leave, paged=paged)
    engine.submit([job for job, _ in jobs])
    engine.start()
    assert all(sink.closed.wait(60) for _, sink in jobs)
    engine.close(60)
    assert engine.stats["deferred"] > 0 and jobs[2][1].end == End("cancelled") and not jobs[2][1].tokens
    for job, sink in jobs[:2]:
        assert [t.token for t in sink.tokens] == generate(model, [job.prompt], 4, DecodeOptions(rule)).tokens[0]
    assert engine.ledger.reserved == 0 and engine.pool.used == 0


@pytest.mark.parametrize("rules", [[GenerationExit("fixed", 3)], MIXED_EXITS, CARRYING_EXITS], ids=lambda r: len(r))
def test_depth_batching_runs_each_row_at_its_own_loop_and_decodes_as_alone(models, rules):
    """Under ``depth`` batching greedy, sampled and scoring jobs at one exit or at several exits and caps, three
    arriving mid-decode, share one depth group (each step one loop of every row's token, each at its own
    loop): each job's tokens and loops are those it gets alone, its log-probabilities within 1e-5. An exit
    that reads each loop's logits on a model with a coda (the retrofit) cannot run there: its jobs share a
    continuous group beside it."""
    model = models
    shared = _mixed_jobs(rules)
    engine = _run(shared, model, "depth", arrivals=[[shared[3][0]], [], [shared[4][0], shared[5][0]]])
    logits_after_coda = any(rule.reads_logits for rule in rules) and len(decodable(model).coda)
    assert engine.kinds == ({DepthGroup, ContinuousGroup} if logits_after_coda else {DepthGroup})
    assert engine.stats["joined"] == 3 and engine.groups == len(engine.kinds), dict(engine.stats)
    alone = _mixed_jobs(rules)
    _run(alone, model, "exact")
    for (_, sink), (_, solo) in zip(shared, alone, strict=True):
        _assert_as_alone(sink, solo)


def test_per_loop_and_shared_jobs_share_one_depth_group_and_decode_as_alone(models):
    """Jobs of the ``per_loop`` and ``shared`` caches in turn, at four exits, share one depth group (a shared
    job's row reads the per-loop stacks at its cap): each job's tokens and loops are those it gets alone with
    its own cache, its log-probabilities within 1e-5."""
    model = models

    def jobs() -> list[tuple[Job, Sink]]:
        made = _mixed_jobs(MIXED_EXITS)
        for job, _ in made[1::2]:
            job.options = job.options.but(cache="shared")
        return made

    shared = jobs()
    engine = _run(shared, model, "depth", arrivals=[[shared[3][0]], [], [shared[4][0], shared[5][0]]])
    if not len(decodable(model).coda):  # the retrofit's kl jobs (logits after a coda) run in continuous groups
        assert engine.kinds == {DepthGroup} and engine.groups == 1, dict(engine.stats)
    assert DepthGroup in engine.kinds
    alone = jobs()
    _run(alone, model, "exact")
    for (_, sink), (_, solo) in zip(shared, alone, strict=True):
        _assert_as_alone(sink, solo)


def test_a_depth_groups_rows_get_tokens_at_their_own_exits_pace(model):
    """A job at 1 loop beside one at 6 in a depth group gets its 6 tokens in 7 steps while the deep one has two
    (its prompt's and one of 6 loops; a continuous group's step runs both tokens to 6 loops); a job that joins
    takes the row the shallow one freed; a job cancelled with its token in flight ends ``cancelled``; the others
    decode as alone."""
    (shallow, shallow_sink), (deep, deep_sink) = (_job(PROMPTS[0], GenerationExit("fixed", 1)),
                                                  _job(PROMPTS[2], GenerationExit("fixed", 6), max_new=4))  # fmt: skip
    group = DepthGroup(model, [shallow, deep], capacity=2, columns=6)
    group.begin()
    for _ in range(7):
        group.step()
    _deliver(shallow, deep)
    assert shallow_sink.end == End("length") and len(deep_sink.tokens) == 2 and group.jobs[0] is None
    newcomer, new_sink = _job(PROMPTS[1], GenerationExit("fixed", 2), max_new=3)
    assert _can_take(group, newcomer) and not _can_take(group, _job(PROMPTS[1], GenerationExit("fixed", 7))[0])
    group.join([newcomer])
    group.step()
    group.step()
    assert group.state.running[1]  # the deep job's second token is in flight
    deep.cancelled.set()
    while not group.done:
        group.step()
    _deliver(deep, newcomer)
    assert deep_sink.end == End("cancelled") and new_sink.end == End("length") and group.held == 0
    for job, sink in ((shallow, shallow_sink), (newcomer, new_sink)):
        _assert_as_alone(sink, _solo(model, job))


def _solo(model, job: Job) -> Sink:
    """What ``job``'s prompt, budget, options and stop give decoded alone (``generate``), as a sink holds it."""
    out = generate(model, [job.prompt], job.max_new, job.options, finished=job.stops)
    sink = Sink()
    for token, depth, logprob in zip(out.tokens[0], out.depths[0], out.logprobs[0], strict=True):
        sink(Token(token, logprob, depth, []))
    return sink


def test_speculative_jobs_admitted_together_share_rounds_stepped_beside_other_jobs(model):
    """Speculative jobs (two budgets, one ending at a stop token) admitted together are rows of one group that
    runs a draft-and-verify round per engine step, beside step-decoder jobs: each gets the tokens and loops of
    ``generate`` with the speculative decoder on its prompt alone, log-probabilities within 1e-5; a
    speculative job whose client leaves mid-decode ends ``cancelled`` and the others go on."""
    options = DecodeOptions(GenerationExit("fixed", 4), decoder="speculative",
                            decoder_params={"draft_loops": 2, "draft_tokens": 3})  # fmt: skip
    stop_at = generate(model, [PROMPTS[0]], 9, options).tokens[0][4]
    stops = [lambda tokens: tokens[-1] == stop_at, None, None, None]
    speculative = []
    for prompt, budget, stop in zip([PROMPTS[0], PROMPTS[2], PROMPTS[3], PROMPTS[1]], [9, 5, 9, 9], stops):
        sink = Sink()
        speculative.append((Job(prompt, budget, options, GREEDY, sink, stops=stop), sink))
    leaving = speculative[3][0]
    stepped = _mixed_jobs([GenerationExit("fixed", 3)])[:3]
    kinds = set()

    def look_and_leave(engine: Engine) -> None:
        kinds.update(type(group) for group in engine.runner.groups.values())
        if engine.stats["steps"] == 2:
            leaving.cancelled.set()

    engine = Engine(model, max_running=8, on_step=look_and_leave)
    engine.submit([job for job, _ in speculative + stepped])
    engine.start()
    assert all(sink.closed.wait(60) for _, sink in speculative + stepped)
    engine.close(60)
    assert kinds == {SpeculativeGroup, ContinuousGroup}
    assert speculative[3][1].end == End("cancelled") and len(speculative[3][1].tokens) < 9
    for job, sink in speculative[:3]:
        _assert_as_alone(sink, _solo(model, job))
        assert sink.end == End("stop" if job.stops else "length")


@pytest.mark.parametrize(
    ("batching", "changes"),
    [
        ("depth", {"cache": "shared"}),  # a dense depth group keeps per-loop stacks for it
        ("continuous", {"decoder": "speculative", "decoder_params": {"draft_loops": 1, "draft_tokens": 4}}),
    ],
    ids=["shared-in-depth", "speculative"],
)
def test_a_job_whose_group_never_fits_is_refused_at_once_not_queued_for_ever(model, batching, changes):
    """A job whose own cache fits the KV memory but whose group (the one its kind gives it, alone; dense
    caches: ``paged=False``) does not is refused when it is submitted, naming the limit; one more byte of room
    takes it and it runs."""
    from looplab.serve.engine import NeverFits
    from looplab.serve.ledger import job_bytes
    from looplab.serve.scheduler import Scheduler

    job, sink = _job(PROMPTS[2], GenerationExit("fixed", 3), max_new=5)
    job.options = job.options.but(**changes)
    alone = job_bytes(model, job)
    group = Scheduler(decodable(model), 8, batching, 10**9, 0, paged=False)._sizes([job], {})[-1](10**9).nbytes
    assert group > alone  # what the job's own cache would suggest is not what its group holds
    engine = Engine(model, batching=batching, kv_memory=group - 1, paged=False)
    with pytest.raises(NeverFits, match="KV memory"):
        engine.submit([job])
    engine = Engine(model, batching=batching, kv_memory=group, paged=False).start()
    engine.submit([job])
    assert sink.closed.wait(60) and sink.end == End("length") and len(sink.tokens) == 5
    engine.close(60)


def test_speculative_jobs_of_two_depths_admitted_together_each_verify_at_their_own(model):
    """Speculative jobs at 4 and at 6 loops submitted together run in groups of their own depth: each gets the
    tokens and loops it gets alone."""
    jobs = []
    for loops in (4, 6, 4):
        options = DecodeOptions(GenerationExit("fixed", loops), decoder="speculative",
                                decoder_params={"draft_loops": 2, "draft_tokens": 3})  # fmt: skip
        sink = Sink()
        jobs.append((Job(PROMPTS[len(jobs)], 6, options, GREEDY, sink), sink))
    engine = Engine(model, max_running=8).start()
    engine.submit([job for job, _ in jobs])
    assert all(sink.closed.wait(60) for _, sink in jobs)
    engine.close(60)
    for job, sink in jobs:
        assert {t.depth for t in sink.tokens} == {job.options.exit_rule.loops}
        _assert_as_alone(sink, _solo(model, job))
