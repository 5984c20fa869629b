"""``looplab serve --replicas 2`` on a Ray head started on loopback: both replicas answer, with the result of
one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from looplab.generation import generate
from looplab.generation.options import DecodeOptions
from looplab.generation.text_lm import open_text_lm
from tests.conftest import free_port
from tests.integration.test_serve import lm_run  # noqa: F401 (the module's tiny LM fixture)
from tests.integration.test_sweep_ray import _descendants, ray_head  # noqa: F401 (a loopback Ray head)

pytestmark = pytest.mark.slow  # a Ray head and Serve's controller, proxy and two replicas: about a minute


def test_two_replicas_behind_ray_serve_answer_as_one_process(lm_run, ray_head):  # noqa: F811
    address, env = ray_head
    port = free_port()
    command = [sys.executable, "-m", "looplab", "serve", str(lm_run), "--replicas", "2", "--ray-address", address,
               "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(command, env={**env, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the replicas did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        lm = open_text_lm(lm_run)
        ref = generate(lm.model, [lm.encode("In the beginning")], 10, DecodeOptions(lm.exit_rule("kl", 6)))
        body = {"model": "lm", "prompt": "In the beginning", "max_tokens": 10, "temperature": 0, "logprobs": 0,
                "exit": "kl", "loops": 6}  # fmt: skip
        replicas = set()
        for _ in range(40):
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            choice = reply.json()["choices"][0]
            assert choice["looplab"]["token_ids"] == ref.tokens[0]
            assert choice["logprobs"]["token_logprobs"] == ref.logprobs[0]
            replicas.add(reply.headers["x-looplab-replica"])
            if len(replicas) == 2:
                break
        assert len(replicas) == 2, f"only {replicas} answered"
        bad = httpx.post(f"{url}/v1/completions", json={**body, "exit": "nope"}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "exit"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            for pid in [*_descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
