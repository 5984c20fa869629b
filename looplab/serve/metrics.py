"""What the server counts: ``GET /metrics`` in Prometheus' text format (prometheus_client), and the loops
of a completion's tokens in its ``usage``.

The engine keeps the counts (:attr:`Engine.stats <looplab.serve.engine.Engine.stats>`, its ``loops``
histogram and ``cache_bytes``); :class:`EngineCollector` reads them at each scrape, so the engine's thread
never waits on a scrape. Each app has its own registry: several apps in one process (the tests, Ray
replicas) count apart.

    looplab_jobs_total{event}        jobs submitted, admitted, joined (a running batch), deferred, preempted,
                                     finished, cancelled, failed
    looplab_tokens_total{kind}       new tokens generated; prompt tokens scored (echo with logprobs); prompt tokens
    looplab_token_loops              histogram of the loops each generated token ran (_sum / _count: the mean)
    looplab_engine_steps_total       the engine's iterations
    looplab_jobs_waiting / _running  jobs queued and decoding now
    looplab_kv_cache_bytes           bytes the running batches' KV caches hold
    looplab_kv_memory_bytes{state}   the KV memory ledger: its limit, what running groups, the paged pool and
                                     kept prefixes reserve, the pool's share, and what is free
                                     (jobs_total{event="deferred"}: jobs put back to wait)
    looplab_kv_blocks{state}         the paged pool's blocks in use and free
    looplab_prefix_tokens_total{result}  prompt tokens in whole blocks looked up in the prefix cache, and served
    looplab_prefix_cache_bytes       bytes the kept prompt blocks hold
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from looplab.serve.batch import Token

__all__ = ["EngineCollector", "registry_for", "loops_usage", "LOOP_BUCKETS"]

#: the loops histogram's upper bounds (every loop count up to 4, then about √2 apart up to the largest cap)
LOOP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096)
JOB_EVENTS = ("submitted", "admitted", "joined", "deferred", "preempted", "finished", "cancelled", "failed")
#: a ``looplab_tokens_total`` kind → the engine's stats key
TOKEN_KINDS = {"generated": "tokens", "scored": "scored_tokens", "prompt": "prompt_tokens"}


class EngineCollector:
    """A prometheus_client collector of one :class:`~looplab.serve.engine.Engine`'s counts (the module docstring
    lists them)."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        engine = self.engine
        stats, loops = dict(engine.stats), dict(engine.loops)  # copies: the engine's thread goes on counting
        jobs = CounterMetricFamily(
            "looplab_jobs", "Jobs (one prompt's completion or scoring) by event", labels=["event"]
        )
        for event in JOB_EVENTS:
            jobs.add_metric([event], stats.get(event, 0))
        yield jobs
        tokens = CounterMetricFamily("looplab_tokens", "Tokens by kind: generated, scored, prompt", labels=["kind"])
        for kind, key in TOKEN_KINDS.items():
            tokens.add_metric([kind], stats.get(key, 0))
        yield tokens
        yield CounterMetricFamily("looplab_engine_steps", "The engine's iterations", value=stats.get("steps", 0))
        yield _loops_histogram(loops)
        yield GaugeMetricFamily("looplab_jobs_waiting", "Jobs queued", value=engine.waiting)
        yield GaugeMetricFamily("looplab_jobs_running", "Jobs decoding", value=engine.running)
        yield GaugeMetricFamily("looplab_kv_cache_bytes", "Bytes the running KV caches hold", value=engine.cache_bytes)
        ledger = engine.ledger
        memory = GaugeMetricFamily("looplab_kv_memory_bytes", "The KV memory ledger", labels=["state"])
        states = (("limit", ledger.limit), ("reserved", ledger.reserved), ("pool", ledger.pool), ("free", ledger.free))
        for state, value in states:
            memory.add_metric([state], value)
        yield memory
        pool = engine.pool
        blocks = GaugeMetricFamily("looplab_kv_blocks", "The paged KV pool's blocks", labels=["state"])
        blocks.add_metric(["used"], pool.used)
        blocks.add_metric(["free"], pool.free)
        yield blocks
        store = engine.prefixes
        prefix = CounterMetricFamily(
            "looplab_prefix_tokens", "Prompt tokens in whole blocks: looked up, served", labels=["result"]
        )
        prefix.add_metric(["asked"], 0 if store is None else store.asked)
        prefix.add_metric(["served"], 0 if store is None else store.served)
        yield prefix
        kept = 0 if store is None else store.nbytes
        yield GaugeMetricFamily("looplab_prefix_cache_bytes", "Bytes the kept prompt blocks hold", value=kept)


def _loops_histogram(loops: dict[int, int]) -> HistogramMetricFamily:
    """Prometheus' cumulative buckets of the generated tokens' loops (``loops``: count by loop count)."""
    buckets = [
        (floatToGoString(bound), sum(n for depth, n in loops.items() if depth <= bound)) for bound in LOOP_BUCKETS
    ]
    buckets.append(("+Inf", sum(loops.values())))
    total = sum(depth * n for depth, n in loops.items())
    return HistogramMetricFamily(
        "looplab_token_loops", "Loops each generated token ran", buckets=buckets, sum_value=total
    )


def registry_for(engine) -> CollectorRegistry:
    """A registry of its own holding ``engine``'s collector."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(EngineCollector(engine))
    return registry


def loops_usage(tokens: list[Token]) -> dict:
    """A completion's ``usage.loops``: the loops its generated ``tokens`` ran, in total, on average (None
    when it generated none) and as a histogram {loops: tokens}."""
    depths = [token.depth for token in tokens]
    histogram: dict[str, int] = {}
    for depth in sorted(depths):
        histogram[str(depth)] = histogram.get(str(depth), 0) + 1
    return {"total": sum(depths), "mean": sum(depths) / len(depths) if depths else None, "histogram": histogram}
