"""``looplab serve`` under load on loopback: tokens/s and latency for 1, 8 and 32 concurrent clients.

On a byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset trained here for
``--steps`` steps of batch 16, about 2 minutes on 2 busy cores), a ``looplab serve`` process per batching mode
(``continuous``, the default: a request joins the running batch of its cache policy at the next step,
whatever its exit, loop cap or sampling; ``exact``: every request's rows alone, results equal to a solo
``generate``; ``cohort``: requests admitted together that share a cache policy are batched) answers the same
``--requests`` completions (KJV validation windows of 8..64 bytes as token-id prompts, ``--max-tokens`` new
tokens each, budgets varied by ±50 %) from 1 client (the requests one at a time: the baseline), 8 and 32
concurrent clients. The cells (CELLS): greedy at a fixed depth (4 loops) and at an adaptive exit (kl, eps
0.01, cap 16); sampled at temperature 1 with a seed each (what an OpenAI client sends by default); and a
mix, request by request, of four exits (fixed 4, kl cap 16, convergence cap 8, confidence cap 6), two cache
policies (per_loop, shared) and greedy or sampled picking. ``exact`` and ``cohort`` run the greedy fixed
cell only; ``depth`` (continuous depth batching: the per_loop requests' rows each at their own loop in one
core call) the kl and mixed cells.

Per cell: new tokens per second of wall time, p50 and p99 request latency (sent → whole response), the
tokens/s ratio to the one-at-a-time run, and how many answers equal the same request's answer one at a
time (token ids; a sampled request's seed fixes its draws). Then what a sampled token costs alone against a
greedy one (one client, fixed 4). The ``memory`` part sends 32 greedy fixed-4 requests at once to a server
whose ``--kv-memory`` is half of what their paged blocks take alone, summed: how many are answered, how many
equal the same request sent alone, and the preemptions and deferrals ``/metrics`` counts. The load is
bounded: ``--requests`` per cell, and a cell stops sending after ``--time-limit`` seconds (the table says
how many were answered).

    python bench/serve.py [--run-dir RUN] [--steps 150] [--requests 48] [--max-tokens 32] [--modes continuous depth]
                          [--parts load prefix memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
from lms import PRESET, trained_lm
from timing import machine_line, print_table, print_verdict, setup

from looplab.experiment import Experiment
from looplab.seeding import derive_generator

FIXED = {"exit": "fixed", "loops": 4}
KL = {"exit": "kl", "loops": 16, "eps": 0.01}
#: the mixed cell's requests take these decode fields in turn (with greedy and sampled picking in turn)
MIX = [
    FIXED,
    KL,
    {"exit": "convergence", "loops": 8, "cache": "shared"},
    {"exit": "confidence", "loops": 6},
    {**FIXED, "cache": "shared"},
    {**KL, "cache": "shared"},
    {"exit": "convergence", "loops": 8},
]


def cell_fields(cell: str, index: int) -> dict:
    """The decode fields of request ``index`` of ``cell``: exit, cache and picking (a seed each)."""
    if cell == "greedy, fixed 4":
        return {**FIXED, "temperature": 0}
    if cell == "greedy, kl (cap 16)":
        return {**KL, "temperature": 0}
    if cell == "sampled T 1, fixed 4":
        return {**FIXED, "temperature": 1.0, "seed": index}
    return {**MIX[index % len(MIX)], "temperature": [0, 1.0][index % 2], "seed": index}


CELLS = ("greedy, fixed 4", "sampled T 1, fixed 4", "greedy, kl (cap 16)", "mixed exits, caches, sampling")
#: the cells each batching mode runs, and the goal of each continuous cell at 32 clients (tokens/s ratio)
MODES = {"continuous": CELLS, "exact": CELLS[:1], "cohort": CELLS[:1], "depth": CELLS[2:]}
GOALS = {"greedy, fixed 4": 6.0, "sampled T 1, fixed 4": 5.0, "greedy, kl (cap 16)": 4.0,
         "mixed exits, caches, sampling": 4.0}  # fmt: skip
#: the most a sampled token may cost against a greedy one, alone
SAMPLED_COST = 1.2
#: the prefix cell: requests sent at once that share a prefix (the LM's context is 512 tokens: 480 shared, then
#: 16 of each request's own), and the goal of the time to first token without the prefix cache over with it
PREFIX_REQUESTS, PREFIX_TOKENS, PREFIX_TAIL, PREFIX_GOAL = 16, 480, 17, 4.0
CLIENTS = (1, 8, 32)
#: the memory cell's concurrent requests
MEMORY_CLIENTS = 32


def prompts(run_dir: str, count: int) -> list[list[int]]:
    """``count`` KJV validation windows of 8..64 bytes (token ids, the start token first)."""
    exp = Experiment.from_run(run_dir)
    out = []
    for index in range(count):
        length = 8 + (index * 13) % 57
        tokens, _ = exp.task.sample_split(length, 1, derive_generator(index, "bench-serve"), "val")
        out.append(tokens[0].tolist())
    return out


def shared_prefix_prompts(run_dir: str, count: int, prefix: int, tail: int) -> list[list[int]]:
    """``count`` prompts: one ``prefix``-token KJV validation window, then each its own ``tail`` tokens."""
    exp = Experiment.from_run(run_dir)
    shared, _ = exp.task.sample_split(prefix, 1, derive_generator(0, "bench-serve-prefix"), "val")
    out = []
    for index in range(count):
        tokens, _ = exp.task.sample_split(tail, 1, derive_generator(index + 1, "bench-serve-prefix"), "val")
        out.append(shared[0].tolist() + tokens[0, 1:].tolist())  # its own tail, without its start token
    return out


async def first_tokens(url: str, bodies: list[dict]) -> list[float]:
    """Send ``bodies`` at once as streams; each one's seconds from sending to its first token."""

    async def one(http: httpx.AsyncClient, body: dict) -> float:
        sent = time.perf_counter()
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["looplab"]["token_ids"]:
                    return time.perf_counter() - sent
        raise SystemExit("a stream ended without a token")

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=len(bodies))) as http:
        return await asyncio.gather(*(one(http, body) for body in bodies))


def start_server(run_dir: str, batching: str, max_running: int, *flags: str) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "looplab", "serve", run_dir, "--port", "0", "--batching", batching,
               "--max-running", str(max_running), "--max-queue", "256", *flags]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = server.stderr.readline()
    while line.startswith("serve: "):  # what the model and its KV caches take
        line = server.stderr.readline()
    if " on http://" not in line:
        server.kill()
        raise SystemExit(f"the server did not start: {line}")
    return server, line.split(" on ")[1].split("/v1")[0]


async def load(
    url: str, bodies: list[dict], clients: int, time_limit: float
) -> tuple[float, list[float], int, dict[int, dict]]:
    """Send ``bodies`` from ``clients`` concurrent clients; (seconds, latencies, new tokens, each answered body's
    ``token_ids`` and its ``usage`` by the body's index)."""
    pending = list(reversed(list(enumerate(bodies))))
    latencies: list[float] = []
    answers: dict[int, list[int]] = {}
    tokens = 0
    began = time.perf_counter()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while pending and time.perf_counter() - began < time_limit:
            index, body = pending.pop()
            sent = time.perf_counter()
            reply = await http.post("/v1/completions", json=body)
            reply.raise_for_status()
            latencies.append(time.perf_counter() - sent)
            answer = reply.json()
            tokens += answer["usage"]["completion_tokens"]
            answers[index] = {"token_ids": answer["choices"][0]["looplab"]["token_ids"], "usage": answer["usage"]}

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit + 60, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return time.perf_counter() - began, latencies, tokens, answers


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load_cells(run_dir: str, windows: list[list[int]], args) -> list[list]:
    """Every batching mode's cells (MODES) under 1, 8 and 32 clients: a table row each."""
    rows = []
    for batching in args.modes:
        cells = MODES[batching]
        server, url = start_server(run_dir, batching, max(CLIENTS))
        try:
            for cell in cells:
                bodies = [
                    {"prompt": p, "max_tokens": max(1, args.max_tokens // 2 + (i * 7) % args.max_tokens),
                     **cell_fields(cell, i)}
                    for i, p in enumerate(windows)
                ]  # fmt: skip
                asyncio.run(load(url, bodies[:4], 1, args.time_limit))  # warm-up
                baseline, alone = None, {}
                for clients in CLIENTS:
                    seconds, latencies, tokens, answers = asyncio.run(load(url, bodies, clients, args.time_limit))
                    rate = tokens / seconds
                    baseline, alone = baseline or rate, alone or answers
                    same = sum(answers[i]["token_ids"] == alone[i]["token_ids"] for i in answers if i in alone)
                    rows.append([
                        batching, cell, clients, f"{len(latencies)}/{len(bodies)}", f"{rate:.0f}",
                        f"{statistics.median(latencies) * 1000:.0f}", f"{percentile(latencies, 0.99) * 1000:.0f}",
                        f"{rate / baseline:.2f}x", f"{same}/{sum(i in alone for i in answers)}",
                    ])  # fmt: skip
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    return rows


def prefix_cell(run_dir: str, warm_up: list[int]) -> dict[str, float]:
    """Mean time to first token of PREFIX_REQUESTS streams sent at once that share a PREFIX_TOKENS-token prefix
    (none of it kept before), by a server with its prefix cache (``with``) and one without (``without``)."""
    shared = shared_prefix_prompts(run_dir, PREFIX_REQUESTS, PREFIX_TOKENS, PREFIX_TAIL)
    bodies = [{"prompt": p, "max_tokens": 8, "temperature": 0, **FIXED} for p in shared]
    ttft = {}
    for label, flags in (("with", ()), ("without", ("--prefix-cache", "0"))):
        server, url = start_server(run_dir, "continuous", max(CLIENTS), *flags)
        try:
            asyncio.run(first_tokens(url, [{**bodies[0], "prompt": warm_up}]))
            ttft[label] = statistics.mean(asyncio.run(first_tokens(url, bodies)))
            scrape = httpx.get(f"{url}/metrics").text
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        counts = [line.split("result=")[1] for line in scrape.splitlines() if line.startswith("looplab_prefix_tokens")]
        print(f"prefix cache {label}: mean time to first token {ttft[label] * 1000:.0f} ms; tokens {', '.join(counts)}")
    return ttft


def memory_cell(run_dir: str, windows: list[list[int]], max_tokens: int) -> list[str]:
    """MEMORY_CLIENTS greedy fixed-4 requests sent at once to a server whose ``--kv-memory`` is half of what
    their blocks take alone, summed (the ledger's reckoning: ``paged_job_bytes``), after the same requests one at
    a time there: a table row (the limit, answered, equal to alone, preempted, deferred, tokens/s of each)."""
    from looplab.generation import GenerationExit, Sampling
    from looplab.generation.options import DecodeOptions
    from looplab.generation.text_lm import open_text_lm
    from looplab.serve.batch import Job
    from looplab.serve.ledger import paged_job_bytes
    from looplab.serve.sampling import Picking

    bodies = [
        {"prompt": p, "max_tokens": max(1, max_tokens // 2 + (i * 7) % max_tokens), **cell_fields(CELLS[0], i)}
        for i, p in enumerate(windows[:MEMORY_CLIENTS])
    ]
    model, options = open_text_lm(run_dir).model, DecodeOptions(GenerationExit("fixed", FIXED["loops"]))
    jobs = [Job(body["prompt"], body["max_tokens"], options, Picking(Sampling()), print) for body in bodies]
    needed = sum(paged_job_bytes(model, job) for job in jobs)
    server, url = start_server(run_dir, "continuous", MEMORY_CLIENTS, "--kv-memory", f"{needed / 2 / 2**30:.12f}")
    try:
        alone_s, _, alone_tokens, alone = asyncio.run(load(url, bodies, 1, 600))
        together_s, _, tokens, together = asyncio.run(load(url, bodies, MEMORY_CLIENTS, 600))
        scrape = httpx.get(f"{url}/metrics").text
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    counts = {
        line.split('event="')[1].split('"')[0]: float(line.split()[-1])
        for line in scrape.splitlines()
        if line.startswith("looplab_jobs_total{")
    }
    same = sum(together[i]["token_ids"] == alone[i]["token_ids"] for i in together if i in alone)
    return [
        f"{needed / 2 / 2**20:.2f} of {needed / 2**20:.2f}", f"{len(together)}/{len(bodies)}", f"{same}/{len(bodies)}",
        f"{counts.get('preempted', 0):.0f}", f"{counts.get('deferred', 0):.0f}",
        f"{alone_tokens / alone_s:.0f}", f"{tokens / together_s:.0f}",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a trained byte-level LM run (default: train the preset here)")
    parser.add_argument("--steps", type=int, default=150, help="training steps when no run is given")
    parser.add_argument("--requests", type=int, default=48, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=32, help="mean new tokens per request")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds a cell may send requests for")
    parser.add_argument("--threads", type=int, default=1)
    parts = ["load", "prefix", "memory"]
    parser.add_argument("--parts", nargs="+", default=parts, choices=parts)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="batching modes")
    args = parser.parse_args()
    setup(args.threads, 0)
    print(machine_line())
    with tempfile.TemporaryDirectory() as scratch:
        began = time.perf_counter()
        sets = ("train.batch_size=16", f"train.warmup_steps={max(1, args.steps // 8)}")
        run_dir = trained_lm(args.run_dir, scratch, args.steps, 2, sets)
        if args.run_dir is None:
            print(f"trained {PRESET} for {args.steps} steps in {time.perf_counter() - began:.0f} s")
        windows = prompts(run_dir, args.requests)
        rows = load_cells(run_dir, windows, args) if "load" in args.parts else []
        ttft = prefix_cell(run_dir, windows[0]) if "prefix" in args.parts else {}
        memory = memory_cell(run_dir, windows, args.max_tokens) if "memory" in args.parts else None
    if rows:
        header = ["batching", "requests", "clients", "answered", "tok/s", "p50 ms", "p99 ms", "vs 1-at-a-time"]
        print_table([*header, "= alone"], rows)
        for batching in args.modes:
            for cell in MODES[batching]:
                if cell in GOALS and batching in ("continuous", "depth"):
                    ratio = next(float(row[-2][:-1]) for row in rows if row[:3] == [batching, cell, max(CLIENTS)])
                    label = f"serve {batching}, {cell}: {max(CLIENTS)} clients vs one at a time"
                    print_verdict(label, ratio, GOALS[cell])
        rates = {row[1]: float(row[4]) for row in rows if row[0] == "continuous" and row[2] == 1}
        if "continuous" in args.modes:
            cost = rates["greedy, fixed 4"] / rates["sampled T 1, fixed 4"]
            label = "serve continuous, one client: a sampled token's cost vs a greedy one's"
            print_verdict(label, cost, SAMPLED_COST, at_most=True)
    if memory:
        header = ["KV MiB (half of all)", "answered", "= alone", "preempted", "deferred", "tok/s 1", "tok/s 32"]
        print_table(header, [memory])
        answered, equal = (int(cell.split("/")[0]) for cell in memory[1:3])
        label = f"serve, {MEMORY_CLIENTS} requests under half the KV memory they need: answered and equal to alone"
        print_verdict(label, min(answered, equal) / MEMORY_CLIENTS, 1.0)
    if ttft:
        label = f"serve, {PREFIX_REQUESTS} requests sharing a {PREFIX_TOKENS}-token prefix: time to first token"
        print_verdict(label + " without / with the prefix cache", ttft["without"] / ttft["with"], PREFIX_GOAL)


if __name__ == "__main__":
    main()
