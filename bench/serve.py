"""``looplab serve`` under load on loopback: tokens/s and latency for 1, 8 and 32 concurrent clients.

On a byte-level looped LM (``--run-dir``, or the ``generation/kjv_trace`` preset trained here for
``--steps`` steps of batch 16, about 2 minutes on 2 busy cores), a ``looplab serve`` process per batching mode
(``continuous``, the default: a greedy request joins the running batch of its exit and cache at the next
step; ``exact``: every request's rows alone, results equal to a solo ``generate``; ``cohort``: requests
admitted together that share an exit are batched) answers the same ``--requests`` greedy completions
(KJV validation windows of 8..64 bytes as token-id prompts, ``--max-tokens`` new tokens each, budgets
varied by ±50 %) from 1 client (the requests one at a time: the baseline), 8 and 32 concurrent
clients, with an adaptive exit (kl, eps 0.01, cap 16) and a fixed depth (4 loops).

Per cell: new tokens per second of wall time, p50 and p99 request latency (sent → whole response), and
the tokens/s ratio to the one-at-a-time run. The load is bounded: ``--requests`` per cell, and a cell
stops sending after ``--time-limit`` seconds (the table says how many were answered).

    python bench/serve.py [--run-dir RUN] [--steps 150] [--requests 48] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
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

EXITS = {"kl (cap 16)": {"exit": "kl", "loops": 16, "eps": 0.01}, "fixed 4": {"exit": "fixed", "loops": 4}}
CLIENTS = (1, 8, 32)


def prompts(run_dir: str, count: int) -> list[list[int]]:
    """``count`` KJV validation windows of 8..64 bytes (token ids, the start token first)."""
    exp = Experiment.from_run(run_dir)
    out = []
    for index in range(count):
        length = 8 + (index * 13) % 57
        tokens, _ = exp.task.sample_split(length, 1, derive_generator(index, "bench-serve"), "val")
        out.append(tokens[0].tolist())
    return out


def start_server(run_dir: str, batching: str, max_running: int) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "looplab", "serve", run_dir, "--port", "0", "--batching", batching,
               "--max-running", str(max_running), "--max-queue", "256"]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = server.stderr.readline()
    if " on http://" not in line:
        server.kill()
        raise SystemExit(f"the server did not start: {line}")
    return server, line.split(" on ")[1].split("/v1")[0]


async def load(url: str, bodies: list[dict], clients: int, time_limit: float) -> tuple[float, list[float], int]:
    """Send ``bodies`` from ``clients`` concurrent clients; (seconds, latencies, new tokens)."""
    pending = list(reversed(bodies))
    latencies: list[float] = []
    tokens = 0
    began = time.perf_counter()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while pending and time.perf_counter() - began < time_limit:
            body = pending.pop()
            sent = time.perf_counter()
            reply = await http.post("/v1/completions", json=body)
            reply.raise_for_status()
            latencies.append(time.perf_counter() - sent)
            tokens += reply.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit + 60, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return time.perf_counter() - began, latencies, tokens


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a trained byte-level LM run (default: train the preset here)")
    parser.add_argument("--steps", type=int, default=150, help="training steps when no run is given")
    parser.add_argument("--requests", type=int, default=48, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=32, help="mean new tokens per request")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds a cell may send requests for")
    parser.add_argument("--threads", type=int, default=1)
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
        rows = []
        for batching in ("continuous", "exact", "cohort"):
            server, url = start_server(run_dir, batching, max(CLIENTS))
            try:
                for exit_name, fields in EXITS.items():
                    bodies = [
                        {"prompt": p, "max_tokens": max(1, args.max_tokens // 2 + (i * 7) % args.max_tokens),
                         "temperature": 0, **fields}
                        for i, p in enumerate(windows)
                    ]  # fmt: skip
                    asyncio.run(load(url, bodies[:4], 1, args.time_limit))  # warm-up
                    baseline = None
                    for clients in CLIENTS:
                        seconds, latencies, tokens = asyncio.run(load(url, bodies, clients, args.time_limit))
                        rate = tokens / seconds
                        baseline = baseline or rate
                        rows.append([
                            batching, exit_name, clients, f"{len(latencies)}/{len(bodies)}", f"{rate:.0f}",
                            f"{statistics.median(latencies) * 1000:.0f}", f"{percentile(latencies, 0.99) * 1000:.0f}",
                            f"{rate / baseline:.2f}x",
                        ])  # fmt: skip
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(60)
    print_table(["batching", "exit", "clients", "answered", "tok/s", "p50 ms", "p99 ms", "vs 1-at-a-time"], rows)
    for exit_name, goal in (("fixed 4", 5.0), ("kl (cap 16)", 4.0)):
        ratio = next(float(row[-1][:-1]) for row in rows if row[:3] == ["continuous", exit_name, max(CLIENTS)])
        print_verdict(f"serve continuous, {exit_name}: {max(CLIENTS)} clients vs one at a time", ratio, goal)


if __name__ == "__main__":
    main()
