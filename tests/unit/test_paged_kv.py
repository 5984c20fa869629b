"""The paged KV pool: a decoder whose keys and values live in a shared pool's blocks computes what the dense
cache computes, bit for bit; the engine's continuous groups draw on one pool and, when it runs out, preempt
the latest admitted job, which is recomputed later with its answer unchanged."""

from __future__ import annotations

import pytest
import torch

from looplab.generation import GenerationExit
from looplab.generation.cache import kv_shape
from looplab.generation.options import DecodeOptions
from looplab.generation.paged import BlockPool, PoolFull
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from looplab.serve.batch import End, Job
from looplab.serve.continuous_group import ContinuousGroup
from looplab.serve.depth_group import DepthGroup
from looplab.serve.engine import Engine, NeverFits
from looplab.serve.ledger import paged_bytes, paged_job_bytes
from looplab.serve.metrics import registry_for
from looplab.serve.pager import Pager
from looplab.serve.prefixes import PrefixStore
from tests.unit.model_helpers import make_model
from tests.unit.test_engine import (
    MIXED_EXITS,
    PICKINGS,
    PROMPTS,
    Sink,
    _assert_as_alone,
    _job,
    _mixed_jobs,
    _run,
)

EXITS = [
    GenerationExit("fixed", 3),
    GenerationExit("convergence", 6, {"eps": 0.2}),
    GenerationExit("kl", 5, {"eps": 0.05}),
]


@pytest.fixture(autouse=True)
def _decoding():
    """No autograd, as generate and the engine decode (a paged read gathers into a buffer the pool keeps)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def model():
    return make_model(causal=True, core_layers=2, max_len=96).eval()


@pytest.fixture(scope="module", params=["looplab", "retrofit"])
def models(request, model):
    """A byte-model-sized looplab model, and a retrofitted Llama (grouped keys and values, a coda)."""
    if request.param == "looplab":
        return model
    pytest.importorskip("transformers")
    from tests.unit.model_helpers import tiny_llama_retrofit

    return tiny_llama_retrofit().eval()


@pytest.mark.parametrize("cache", ["per_loop", "shared"])
@pytest.mark.parametrize("rule", EXITS, ids=lambda rule: rule.name)
def test_a_paged_decoder_computes_the_dense_decoders_floats(models, rule, cache):
    """Tokens, loops and log-probabilities equal to the dense cache's exactly (blocks of 4 slots: prompts and
    generations span several); every block a row holds is given back when the rows are released."""
    view = decodable(models)
    options = DecodeOptions(rule, cache=cache)
    prompts = [*PROMPTS, [1, 4, 4, 4] * 5]
    dense = Decoder(view, prompts, 12, options).run()
    heads, head_dim, dtype = kv_shape(view)
    pool = BlockPool(heads, head_dim, dtype, "cpu", blocks=4000, slots=4)
    decoder = Decoder(view, prompts, 12, options, pool=pool)
    paged = decoder.run()
    assert paged.tokens == dense.tokens and paged.depths == dense.depths and paged.logprobs == dense.logprobs
    assert pool.used > 0 and decoder.cache.nbytes() == pool.used * pool.block_bytes
    decoder.cache.release(torch.arange(len(prompts)))
    assert pool.used == 0 and decoder.cache.nbytes() == 0


def test_a_pool_gives_what_it_has_grows_and_refuses_what_it_lacks():
    pool = BlockPool(2, 4, torch.float32, "cpu", blocks=4, slots=2)
    assert (pool.capacity, pool.free, pool.block_bytes) == (4, 2, 2 * 2 * 2 * 4 * 4)
    taken = pool.take(2)
    assert sorted(taken.tolist()) == [2, 3] and pool.free == 0  # the null block and the sink are never handed out
    with pytest.raises(PoolFull, match="1 KV blocks asked for, 0 free of 2"):
        pool.take(1)
    pool.k[taken] = 7.0
    pool.grow(7)
    assert pool.free == 3 and bool((pool.k[taken] == 7.0).all())  # grown, the blocks in use kept
    pool.give(taken)
    assert pool.used == 0 and pool.free == 5
    pool.grow(9)  # no block taken: made anew, nothing copied
    assert (pool.capacity, pool.free) == (9, 7) and not pool.k.any() and not pool.v.any()
    assert sorted(pool.take(7).tolist()) == list(range(2, 9))


def _tight_jobs(model, count=6, max_new=40, caches=("per_loop",)):
    """``count`` jobs of mixed pickings and exits (and ``caches`` in turn), and a KV memory that holds every
    prompt but only half of the blocks their generations reach (so the pool runs out mid-decode)."""
    jobs = []
    for index in range(count):
        prompt, picking = PROMPTS[index % len(PROMPTS)], PICKINGS[index % 5]  # no scoring job: budgets alike
        sink, options = Sink(), DecodeOptions(EXITS[index % 3], cache=caches[index % len(caches)])
        jobs.append((Job(prompt, max_new, options, picking, sink), sink))
    widest = max(len(job.prompt) for job, _ in jobs)
    whole = sum(paged_bytes(model, job.options, widest + max_new, 6) for job, _ in jobs)
    return jobs, whole // 2


@pytest.mark.parametrize("caches", [("per_loop",), ("per_loop", "shared")], ids=len)
def test_a_pool_that_runs_out_preempts_the_latest_job_which_is_recomputed_as_alone(model, caches):
    """Greedy and seeded sampled jobs at three exits (of the per_loop cache, or of both policies in one
    group), in a KV memory of half what they reach: jobs are preempted (counted), every one is answered, and
    each one's tokens and loops are those it gets alone, its log-probabilities within 1e-5 (a sampled job
    draws nothing while it replays); the pool is empty after."""
    jobs, memory = _tight_jobs(model, caches=caches)
    engine = Engine(model, max_running=8, kv_memory=memory, prefix_memory=0).start()
    engine.submit([job for job, _ in jobs])
    assert all(sink.closed.wait(120) for _, sink in jobs)
    engine.close(60)
    assert engine.stats["preempted"] > 0, dict(engine.stats)
    alone, _ = _tight_jobs(model, caches=caches)
    _run(alone, model, "exact")
    for (_, sink), (_, solo) in zip(jobs, alone, strict=True):
        _assert_as_alone(sink, solo)
        assert sink.end == End("length")
    assert engine.ledger.pool == 0 and engine.pool.used == 0
    text = _metrics(engine)
    assert f'looplab_jobs_total{{event="preempted"}} {float(engine.stats["preempted"])}' in text
    assert 'looplab_kv_blocks{state="used"} 0.0' in text


def test_a_depth_group_paged_in_a_pool_that_runs_out_preempts_and_recomputes_as_alone(model, monkeypatch):
    """Under ``depth`` batching (rows at their own loops, paged: the core's per-loop tables indexed by each row's
    loop) per_loop and shared jobs at three exits in a small KV memory: jobs are preempted,
    one of them with its token in flight (its loops half run); every one is answered as alone; the pool is
    empty after."""
    jobs, _ = _tight_jobs(model, count=8, caches=("per_loop", "shared"))
    _, memory = _tight_jobs(model, count=8)  # half what they would reach all per_loop (a third is given)
    in_flight = []
    preempt = DepthGroup.preempt

    def preempt_and_look(group, job):
        in_flight.append(bool(group.state.running[group.jobs.index(job)]))
        preempt(group, job)

    monkeypatch.setattr(DepthGroup, "preempt", preempt_and_look)
    kinds = set()
    engine = Engine(
        model, max_running=8, batching="depth", kv_memory=memory * 2 // 3, prefix_memory=0,
        on_step=lambda engine: kinds.update(type(group) for group in engine.runner.groups.values()),
    ).start()  # fmt: skip
    engine.submit([job for job, _ in jobs])
    assert all(sink.closed.wait(120) for _, sink in jobs)
    engine.close(60)
    assert any(in_flight) and kinds == {DepthGroup}, (in_flight, dict(engine.stats), kinds)
    alone, _ = _tight_jobs(model, count=8, caches=("per_loop", "shared"))
    _run(alone, model, "exact")
    for (_, sink), (_, solo) in zip(jobs, alone, strict=True):
        _assert_as_alone(sink, solo)
        assert sink.end == End("length")
    assert engine.pool.used == 0


def test_an_idle_pool_keeps_its_blocks_for_the_next_burst(model):
    """When its jobs end the pool's memory goes back to the ledger (0 bytes, no blocks reported) but its blocks
    are kept, all free: the next burst's group takes them without growing the pool, and decodes as before."""
    jobs, memory = _tight_jobs(model, count=4, max_new=8)
    engine = Engine(model, max_running=8, kv_memory=4 * memory, prefix_memory=0).start()
    answers = []
    for burst in range(2):
        jobs, _ = _tight_jobs(model, count=4, max_new=8)
        engine.submit([job for job, _ in jobs])
        assert all(sink.closed.wait(120) for _, sink in jobs)
        answers.append([sink.tokens for _, sink in jobs])
        pool = engine.runner.pager.pool
        assert pool is not None and pool.used == 0 and pool.capacity > 2, burst
        assert engine.ledger.pool == 0 and engine.pool.nbytes == 0 and engine.pool.free == 0
        if burst == 0:
            first, capacity = pool, pool.capacity
    engine.close(60)
    assert engine.runner.pager.pool is first and first.capacity == capacity
    assert answers[0] == answers[1] and engine.stats["preempted"] == 0
    assert 'looplab_kv_blocks{state="free"} 0.0' in _metrics(engine)


def test_an_idle_pool_goes_when_the_room_no_longer_holds_it_beside_the_kept_prefixes():
    """Kept while the step's room holds it and the kept prefixes (whose room it then narrows, as a pool that
    grows does); let go when the ledger gave its memory away, and made anew by the next paged group."""
    pager = Pager(PrefixStore(1 << 20))
    pool = pager.pool_for(2, 4, torch.float32, "cpu")
    pager.room = 1 << 20
    assert pager.grant(30) and pool.capacity >= 32
    pager.room = pool.nbytes + 1000
    pager.fit_idle()
    assert pager.pool is pool and pager.prefixes.room == 1000
    pager.prefixes.nbytes = 1001  # prefixes kept since (as a step's keeping would)
    pager.fit_idle()
    assert pager.pool is None
    assert pager.pool_for(2, 4, torch.float32, "cpu") is not pool
    pager.groups = [object()]  # a paged group runs: the pool is not idle, whatever the room
    pager.room = 0
    pager.fit_idle()
    assert pager.pool is not None


def _metrics(engine: Engine) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry_for(engine)).decode()


def test_a_job_whose_client_leaves_while_it_is_preempted_ends_cancelled_and_frees_its_blocks(model):
    """The first preempted job's client leaves while it waits to be recomputed: it ends ``cancelled`` with the
    tokens it had, its blocks already back in the pool; the others are answered as alone."""
    jobs, memory = _tight_jobs(model)
    left: list[Job] = []

    def leave(engine: Engine) -> None:
        if engine.stats["preempted"] and not left:
            left.append(next(job for job in engine.scheduler.waiting if job.replay))
            left[0].cancelled.set()

    engine = Engine(model, max_running=8, kv_memory=memory, prefix_memory=0, on_step=leave).start()
    engine.submit([job for job, _ in jobs])
    assert all(sink.closed.wait(120) for _, sink in jobs)
    engine.close(60)
    assert left and engine.stats["cancelled"] == 1
    alone, _ = _tight_jobs(model)
    _run(alone, model, "exact")
    for (job, sink), (_, solo) in zip(jobs, alone, strict=True):
        if job is left[0]:
            assert sink.end == End("cancelled") and 0 < len(sink.tokens) < job.max_new
            assert [t.token for t in sink.tokens] == [t.token for t in solo.tokens[: len(sink.tokens)]]
            continue
        _assert_as_alone(sink, solo)
        assert sink.end == End("length")
    assert engine.pool.used == 0


def test_a_continuous_job_larger_than_the_pool_can_ever_hold_is_refused_naming_the_limit(model):
    """A job whose blocks alone (and the pool's null block) exceed the KV memory is refused at submit; with
    exactly that much it runs."""
    job, sink = _job(PROMPTS[2], GenerationExit("fixed", 3), max_new=30)
    needed = paged_job_bytes(model, job)
    with pytest.raises(NeverFits, match="KV memory"):
        Engine(model, kv_memory=needed - 1).submit([job])
    engine = Engine(model, kv_memory=needed, prefix_memory=0).start()
    engine.submit([job])
    assert sink.closed.wait(60) and sink.end == End("length") and len(sink.tokens) == 30
    engine.close(60)


def test_mixed_jobs_in_a_roomy_pool_are_never_preempted_and_decode_as_alone(model):
    """With room for all, nothing is preempted, and the pool-paged engine gives what the exact engine gives."""
    shared, alone = _mixed_jobs(EXITS), _mixed_jobs(EXITS)
    engine = _run(shared, model, "continuous")
    _run(alone, model, "exact")
    assert engine.stats["preempted"] == 0
    for (_, sink), (_, solo) in zip(shared, alone, strict=True):
        _assert_as_alone(sink, solo)


def _both_caches() -> list[tuple[Job, Sink]]:
    """The mixed jobs of :data:`MIXED_EXITS`, every other one asking for a ``shared`` cache."""
    made = _mixed_jobs(MIXED_EXITS)
    for job, _ in made[1::2]:
        job.options = job.options.but(cache="shared")
    return made


def test_per_loop_and_shared_jobs_share_one_paged_continuous_group_and_decode_as_alone(models):
    """Jobs of the ``per_loop`` and ``shared`` caches in turn, at four exits and caps, greedy, sampled and
    scoring, some arriving mid-decode, run as rows of one paged continuous group (a shared job's row keeps one
    store across loops: its later loops' tables point at loop 1's blocks); each job's tokens and loops are
    those it gets alone with its own cache, its log-probabilities within 1e-5; every block goes back."""
    jobs = _both_caches()
    engine = _run(jobs, models, "continuous", arrivals=[[jobs[3][0]], [], [jobs[4][0], jobs[5][0]]])
    assert engine.kinds == {ContinuousGroup} and engine.groups == 1, dict(engine.stats)
    alone = _both_caches()
    _run(alone, models, "exact")
    for (_, sink), (_, solo) in zip(jobs, alone, strict=True):
        _assert_as_alone(sink, solo)
    assert engine.pool.used == 0


def test_shared_jobs_outside_a_group_of_both_policies_keep_their_own_shared_cache(model):
    """Shared jobs at the read-only exit (which runs every row to one cap: they keep a group of their own,
    under the shared policy) run paged beside a per_loop job, each equal to alone."""

    def jobs() -> list[tuple[Job, Sink]]:
        made = [_job(prompt, GenerationExit("convergence", 5, {"eps": 0.2})) for prompt in PROMPTS[:3]]
        for job, _ in made[1:]:
            job.options = job.options.but(cache="shared", decoder_params={"read_only_exit": True})
        return made

    paged, alone = jobs(), jobs()
    engine = _run(paged, model, "continuous")
    _run(alone, model, "exact")
    assert engine.groups == 2 and engine.stats["failed"] == 0, dict(engine.stats)
    for (_, sink), (_, solo) in zip(paged, alone, strict=True):
        _assert_as_alone(sink, solo)


def test_a_row_takes_blocks_for_its_own_prompt_at_its_own_cap_as_the_scheduler_prices_it(model):
    """Jobs of short and long prompts, caps 3 and 6, per_loop and shared, join a group of a wider prompt and a
    deeper cap together: the pool gives exactly the blocks the scheduler prices for their prompts (none for
    the padding after the shorter ones, none for loops past a row's cap, one store across loops for a shared
    row); the null block stays zeros; leaving, they give every one back."""
    running, _ = _job([1, 2, 3, 4, 5, 6, 5] * 4, EXITS[1], max_new=4)  # 28 tokens, cap 6
    group, pager = _paged_group(model, [running])
    group.begin()
    held = pager.pool.used
    joining = [
        _job(PROMPTS[1], EXITS[0], max_new=4)[0],
        _job([1, 5, 4, 2] * 5, EXITS[0], max_new=4)[0],
        _job(PROMPTS[2], EXITS[1], max_new=4)[0],
    ]
    joining[2].options = joining[2].options.but(cache="shared")
    priced = sum(paged_bytes(model, job.options, len(job.prompt), job.options.exit_rule.loops) for job in joining)
    group.join(joining)
    assert (pager.pool.used - held) * pager.pool.block_bytes == priced
    assert group.decoder.cache.nbytes() == pager.pool.used * pager.pool.block_bytes
    assert not pager.pool.k[0].any() and not pager.pool.v[0].any()
    for row, job in enumerate(group.jobs):
        if job is not None and job is not running:
            group.leave(row)
    assert pager.pool.used == held


def test_blocks_taken_and_given_back_in_any_order_balance(model):
    """Rows placed at random caps, some keeping one store across loops, taking blocks for random chunks of their
    real slots and released in random order: after every operation the pool's used blocks are what the cache
    says it holds, no block is in two places a row owns, and at the end every block is back, once."""
    view = decodable(model)
    heads, head_dim, dtype = kv_shape(view)
    pool = BlockPool(heads, head_dim, dtype, "cpu", blocks=3000, slots=4)
    decoder = Decoder(view, [[1]] * 6, 24, DecodeOptions(GenerationExit("fixed", 4)), width=12, cap=4, pool=pool)
    cache, draw = decoder.cache, torch.Generator().manual_seed(0)
    holding: set[int] = set()

    def rand(high: int) -> int:
        return int(torch.randint(high, (1,), generator=draw))

    for _ in range(200):
        row = torch.tensor([rand(6)])
        if int(row) in holding and rand(3) == 0:
            cache.release(row)
            holding.discard(int(row))
        elif int(row) not in holding:
            length = 1 + rand(12)
            decoder.place(row, [[1] * length], [GenerationExit("fixed", 1 + rand(4))], torch.tensor([rand(2) == 1]))
            cache.reserve(row, slice(0, 12))
            holding.add(int(row))
        else:
            slot = 12 + rand(24)
            decoder.start(row, slot, torch.tensor([slot]))
            cache.reserve(row, slice(slot, slot + 1))
        assert cache.nbytes() == pool.used * pool.block_bytes
        owned = []
        tables = cache.blocks
        for loop, keys in tables.loop_tables.items():
            mine = tables.held & tables.owns(loop, tables.row_loops, tables.loop_shared)[:, None]
            owned += [int(i) for key in keys for i in tables.tables[key][mine]]
        assert len(owned) == len(set(owned)) == pool.used and min(owned, default=2) >= 2
    cache.release(torch.arange(6))
    assert pool.used == 0 and len(set(pool.free_ids)) == pool.free == pool.capacity - 2


def test_a_dense_engine_reserves_its_groups_whole_and_never_preempts(model):
    """``paged=False`` (``looplab serve --dense-kv``): the same jobs under the same memory wait for room instead
    (deferred, never preempted), the continuous groups' bytes held by the ledger, none by a pool; each job
    decodes as alone."""
    jobs, memory = _tight_jobs(model)
    held = []
    engine = Engine(
        model, max_running=8, kv_memory=memory * 4, prefix_memory=0, paged=False,
        on_step=lambda engine: held.append((engine.ledger.held_by_groups, engine.ledger.pool)),
    ).start()  # fmt: skip
    engine.submit([job for job, _ in jobs])
    assert all(sink.closed.wait(120) for _, sink in jobs)
    engine.close(60)
    assert engine.stats["preempted"] == 0 and engine.stats["finished"] == len(jobs)
    assert max(by_groups for by_groups, _ in held) > 0 and all(pool == 0 for _, pool in held)
    alone, _ = _tight_jobs(model)
    _run(alone, model, "exact")
    for (_, sink), (_, solo) in zip(jobs, alone, strict=True):
        _assert_as_alone(sink, solo)


def _paged_group(model, jobs):
    """A continuous group of ``jobs`` paged in a pager's pool with room for them, its first jobs prefilled."""
    from looplab.serve.continuous_group import ContinuousGroup
    from looplab.serve.pager import Pager

    pager = Pager()
    pager.room = 10**9
    group = ContinuousGroup(model, jobs, capacity=4, columns=8, pager=pager)
    pager.groups.append(group)
    return group, pager


def test_an_abandoned_group_gives_its_blocks_back(model):
    """A group the engine fails (a step raised) frees every row it held, and the pool every block."""
    group, pager = _paged_group(model, [_job(p, EXITS[0], max_new=4)[0] for p in PROMPTS[:3]])
    group.begin()
    group.step()
    assert pager.pool.used > 0 and group.held == 3
    group.abandon()
    assert pager.pool.used == 0 and group.done and all(job is None for job in group.jobs)


def test_a_join_whose_second_prefill_fails_frees_the_rows_of_the_first_too(model, monkeypatch):
    """Jobs prefilled in two batches (a kept prefix's followers after its leaders): when the second batch's
    prefill raises, the first batch's rows, already live, are freed as well (the runner fails every one of
    the jobs), so none of them is stepped after it has failed; the pool keeps only the running job's blocks."""
    running, _ = _job(PROMPTS[0], EXITS[0], max_new=4)
    group, pager = _paged_group(model, [running])
    group.begin()
    held = pager.pool.used
    first, second = _job(PROMPTS[1], EXITS[0], max_new=4)[0], _job(PROMPTS[3], EXITS[0], max_new=4)[0]
    monkeypatch.setattr(group, "_leaders", lambda jobs: ([jobs[0]], [jobs[1]]))
    enter = group.decoder.enter
    calls = []

    def failing_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return enter(*args, **kwargs)

    monkeypatch.setattr(group.decoder, "enter", failing_second)
    with pytest.raises(RuntimeError, match="out of memory"):
        group.join([first, second])
    assert group.held == 1 and [job for job in group.jobs if job is not None] == [running]
    assert pager.pool.used == held
