"""``looplab serve``: an OpenAI-compatible HTTP server for looped LMs, with continuous batching and a depth
per token (docs/commands.md, "looplab serve").

    request.py   the checked body of POST /v1/completions (HTTP 400, one line naming the field)
    choice.py    a prompt's engine jobs and the OpenAI-shaped choice built from their tokens
    batch.py     a job, and a group of jobs stepped one token at a time by one Decoder
    continuous_group.py  a group that newcomers join between two steps (continuous batching)
    depth_group.py a group whose rows each run at their own loop (continuous depth batching)
    speculative_group.py  speculative jobs stepped a draft-and-verify round at a time
    whole_group.py  a job whose decoder is not stepped (depth, wavefront, recompute, a plugin's): run whole, alone
    scheduler.py job states, admission and the KV memory ledger: what the runner does each step
    runner.py    the model, every group's decoder and caches, the kept prefixes: does what it is told
    messages.py  the plain messages between the two
    engine.py    the thread that runs the scheduler and the runner in turn, and the queue's front door
    ledger.py    the KV memory ledger: one limit on every running group's caches
    pager.py     the paged KV pool of the continuous groups, and preemption by recompute
    prefixes.py  prefix caching: kept prompt blocks' keys and values
    metrics.py   GET /metrics (Prometheus) and a completion's usage.loops
    sampling.py  looplab's picking plus top_p, per row of a shared batch
    app.py       the FastAPI routes; server.py: uvicorn with a draining SIGTERM
    replicas.py  N replicas behind Ray Serve

Each request is decoded by :class:`~looplab.generation.step.Decoder`, the decoder of
:func:`looplab.generation.generate`, stepped from outside (:mod:`looplab.serve.batch`), so a greedy
request's tokens and loops, and a seeded sampled request's, are those of ``generate`` on its prompt alone,
whatever runs beside it
(under ``--batching exact`` its log-probabilities too, bit for bit: :mod:`looplab.serve.engine` says why);
a request naming another decoder runs through ``generate`` itself (:mod:`looplab.serve.whole_group`).
"""

from looplab.serve.app import create_app, model_id
from looplab.serve.engine import BATCHING, Busy, Closed, Engine

__all__ = ["BATCHING", "Busy", "Closed", "Engine", "create_app", "model_id"]
