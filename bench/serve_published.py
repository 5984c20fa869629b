"""``looplab serve`` at the published shapes: Ouro-1.4B (and Huginn-0125) as model dirs of random weights
(``published_shapes.write_random_dir``), in float32 on this CPU, under 1 and ``--clients`` concurrent
clients on loopback.

A ``looplab serve DIR`` process (its memory lines, printed before and after loading, are echoed) answers
``--requests`` greedy completions of ``--max-tokens`` new tokens after a ``--prompt``-token prompt of token
ids, at the family's fixed depth (Ouro 4 loops, its native count; Huginn ``--huginn-loops``): one at a time
(the baseline), then from ``--clients`` clients at once. For Ouro, the same again with its ``gate`` exit at
τ 0.5 (each request's ``usage.loops`` gives the mean depth its tokens ran). Each ``--batching`` mode gets a
server of its own: ``continuous`` (a step runs every row's token to its exit, so the deepest row sets the
step's loops) and ``depth`` (a step is one loop of every row's token, each at its own loop).

Per cell: new tokens per second of wall time, p50 latency, the ratio to one at a time, how many answers
equal the same request's answer one at a time, and the engine steps it took and the requests that joined a
running batch (``/metrics``: how the arrivals were batched, which moves the tokens/s from run to run).
Goals (Ouro): ``--clients`` 8 ≥ 3× one client's tokens/s; under that load the gate exit's tokens/s ≥ 0.8 ×
(4 / its mean depth) × fixed 4's.

    python bench/serve_published.py [--family ouro huginn] [--batching continuous depth] [--requests 8]
                                    [--clients 8] [--max-tokens 8] [--dense-kv]

About 4 minutes a batching mode for Ouro on 2 cores, 20 GiB of memory and 10 minutes more for Huginn.
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
from pathlib import Path

import httpx
from published_shapes import write_random_dir
from serve import load
from timing import machine_line, print_table, print_verdict

#: each family's depth under test: Ouro's native 4 loops; Huginn at fewer than its native 32 recurrences (a
#: token at 32 takes 8 s here: the point is that it serves, not how fast)
FIXED = {"ouro": {"exit": "fixed", "loops": 4}, "huginn": {"exit": "fixed", "loops": 8}}
GATE = {"exit": "gate", "loops": 4, "threshold": 0.5}
#: the goals: clients vs one at a time (tokens/s), and the gate's share of its ideal speed-up under load
GOAL_CLIENTS, GOAL_GATE = 3.0, 0.8


def start_server(
    model_dir: Path, max_running: int, threads: int, batching: str, *flags: str
) -> tuple[subprocess.Popen, str]:
    """``looplab serve`` on a free loopback port; its stderr lines up to the address are echoed."""
    command = [sys.executable, "-m", "looplab", "serve", str(model_dir), "--port", "0",
               "--max-running", str(max_running), "--max-queue", "64", "--batching", batching,
               "--dtype", "float32", *flags]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    while True:
        line = server.stderr.readline()
        if not line:
            raise SystemExit(f"the server exited ({server.wait()}) before listening")
        print(f"  {line.rstrip()}", flush=True)
        if " on http://" in line:
            return server, line.split(" on ")[1].split("/v1")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=["ouro"], choices=sorted(FIXED))
    parser.add_argument("--batching", nargs="+", default=["continuous", "depth"], choices=["continuous", "depth"])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dense-kv", action="store_true", help="serve with dense KV caches, not the paged pool")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds a cell may send requests for")
    args = parser.parse_args()
    print(machine_line())
    rows, rates, depths = [], {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.family:
            began = time.perf_counter()
            model_dir = write_random_dir(family, Path(scratch) / family)
            print(f"{family}: wrote its published shape in {time.perf_counter() - began:.0f} s", flush=True)
            for batching in args.batching:
                flags = ("--dense-kv",) if args.dense_kv else ()
                server, url = start_server(model_dir, args.clients, args.threads, batching, *flags)
                try:
                    for cell, fields in cells_of(family).items():
                        rows += run_cell(url, args, family, batching, cell, fields, rates, depths)
                finally:
                    server.send_signal(signal.SIGTERM)
                    server.wait(120)
    header = ["family", "batching", "exit", "clients", "answered", "tok/s", "p50 s", "mean loops", "vs 1 client",
              "= alone", "steps", "joined"]  # fmt: skip
    print_table(header, rows)
    if "ouro" not in args.family:
        return
    for batching in args.batching:
        key = ("ouro", batching)
        ratio = rates[(*key, "fixed", args.clients)] / rates[(*key, "fixed", 1)]
        label = f"serve ouro-1.4b float32, {batching}: {args.clients} clients vs one at a time"
        print_verdict(label, ratio, GOAL_CLIENTS)
        ideal = 4 / depths[(*key, "gate 0.5", args.clients)]
        share = rates[(*key, "gate 0.5", args.clients)] / rates[(*key, "fixed", args.clients)] / ideal
        label = f"serve ouro-1.4b, {batching}, {args.clients} clients: gate 0.5 vs fixed 4 tokens/s"
        label += ", over 4 / mean depth"
        print_verdict(label, share, GOAL_GATE)


def engine_counts(url: str) -> dict[str, float]:
    """The server's engine steps and job counts (``joined``: jobs that joined a running batch, each prefilled
    there with the others joining that step) from ``/metrics``."""
    counts = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("looplab_jobs_total{"):
            counts[line.split('event="')[1].split('"')[0]] = float(line.split()[-1])
        elif line.startswith("looplab_engine_steps_total "):
            counts["steps"] = float(line.split()[-1])
    return counts


def cells_of(family: str) -> dict[str, dict]:
    """The decode fields of each cell a family runs: its fixed depth, and Ouro's gate."""
    return {"fixed": FIXED[family], **({"gate 0.5": GATE} if family == "ouro" else {})}


def run_cell(url: str, args, family: str, batching: str, cell: str, fields: dict, rates: dict, depths: dict) -> list:
    """The cell's table rows: its requests one at a time, then from ``args.clients`` clients at once (tokens/s
    and mean depths into ``rates`` and ``depths``, keyed by family, batching, cell and clients)."""
    bodies = [
        {"prompt": [1 + (7 * i + 3 * j) % 250 for j in range(args.prompt)],
         "max_tokens": args.max_tokens, "temperature": 0, **fields}
        for i in range(args.requests)
    ]  # fmt: skip
    rows, alone = [], None
    for clients in (1, args.clients):
        before = engine_counts(url)
        seconds, latencies, tokens, answers = asyncio.run(load(url, bodies, clients, args.time_limit))
        counts = {key: value - before.get(key, 0) for key, value in engine_counts(url).items()}
        key = (family, batching, cell, clients)
        rates[key] = tokens / seconds
        depths[key] = statistics.mean(answer["usage"]["loops"]["mean"] for answer in answers.values())
        tokens_of = {i: answer["token_ids"] for i, answer in answers.items()}
        alone = alone or tokens_of
        same = sum(tokens_of[i] == alone.get(i) for i in tokens_of)
        ratio = rates[key] / rates[family, batching, cell, 1]
        rows.append([family, batching, cell, clients, f"{len(latencies)}/{len(bodies)}", f"{rates[key]:.2f}",
                     f"{statistics.median(latencies):.1f}", f"{depths[key]:.2f}", f"{ratio:.2f}x",
                     f"{same}/{len(tokens_of)}", f"{counts.get('steps', 0):.0f}",
                     f"{counts.get('joined', 0):.0f}"])  # fmt: skip
        print("row: " + " | ".join(map(str, rows[-1])), flush=True)
    return rows


if __name__ == "__main__":
    main()
