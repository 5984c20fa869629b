"""``looplab serve --replicas N``: N copies of the server behind Ray Serve's HTTP proxy.

Each replica is a Ray actor that runs the same FastAPI app (:func:`looplab.serve.app.create_app`, its
lifespan opening the model and starting its own continuous-batching engine); Ray Serve's proxy listens
on ``host:port`` and routes each request to a replica (to the least loaded of two it draws). The API,
its errors and its results are those of one process; the ``x-looplab-replica`` header says which
replica answered.

On one machine this starts a local Ray head (``ray.init()``). On a cluster, start Ray on each node
(``ray start --head`` on one, ``ray start --address HEAD:6379`` on the others), put the model directory
where every node reads it at the same path (a shared file system), and run ``looplab serve DIR
--replicas N --ray-address HEAD:6379 --host 0.0.0.0``: Ray places the N replicas on the nodes with a
free CPU (a GPU with ``--device cuda``), and the proxy on the head answers on ``--port``.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from looplab.errors import LooplabError
from looplab.serve.app import create_app

__all__ = ["serve_replicas"]


def _check_reachable(address: str, seconds: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` Ray address nothing answers at within ``seconds`` (Ray itself retries for
    minutes without a word); other forms (``auto``, ``ray://``) are left to Ray."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as err:
        raise LooplabError(
            f"cannot reach the Ray cluster at {address}: {err.strerror or err} (start it with `ray start --head`, "
            "or leave out --ray-address for a local one)"
        ) from None


class LooplabReplica:
    """One replica: the routes are the app's (``serve.ingress``), the state its lifespan's."""


def serve_replicas(
    path: str | Path,
    replicas: int,
    host: str,
    port: int,
    address: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer: str | None = None,
    **engine_options,
) -> None:
    """Deploy ``replicas`` copies of the server on Ray and answer on ``host:port`` until SIGTERM / SIGINT (a model
    dir's tokenizer from ``tokenizer`` where it holds none)."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise LooplabError("--replicas needs Ray Serve, which is not installed: pip install 'looplab[ray]'") from None
    path = str(Path(path).resolve())  # the replicas open it themselves, from their own working dirs
    tokenizer = None if tokenizer is None else str(Path(tokenizer).resolve())
    if address:
        _check_reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, **({} if address else {"include_dashboard": False}))
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise LooplabError(f"cannot reach the Ray cluster at {address}: {str(err).splitlines()[0]}") from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": host, "port": port})
        app = create_app(path, dtype=dtype, device=device, tokenizer=tokenizer, **engine_options)
        gpu = 1 if device.startswith("cuda") else 0
        deployment = serve.deployment(
            name="looplab",
            num_replicas=replicas,
            ray_actor_options={"num_cpus": 0 if gpu else 1, "num_gpus": gpu},
            max_ongoing_requests=engine_options.get("max_running", 32) + engine_options.get("max_queue", 64),
        )(serve.ingress(app)(LooplabReplica))
        serve.run(deployment.bind(), name="looplab", route_prefix="/")
        print(
            f"looplab serve: {Path(path).name}, {replicas} replicas behind Ray Serve on http://{host}:{port}/v1 "
            "(SIGTERM or Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        stop.wait()
        print("looplab serve: shutting down the replicas", file=sys.stderr, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        serve.shutdown()
        ray.shutdown()
