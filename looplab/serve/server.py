"""Running the app under uvicorn on one socket, with looplab's shutdown: on SIGTERM (or Ctrl-C) the engine
stops taking requests (HTTP 503), uvicorn closes the listening socket and waits for the requests in
flight, the engine drains, and the process exits 0. A second Ctrl-C ends the requests in flight at their
next token (each answered with what it has, ``finish_reason`` ``cancelled``), so the exit is as clean and
soon; a third stops waiting for them.

uvicorn's own handler re-raises the signal once it has shut down (so the process would end *by*
SIGTERM); :class:`_Server` keeps the graceful part and returns instead.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading

import uvicorn

__all__ = ["bind", "run_app"]


class _Server(uvicorn.Server):
    """uvicorn's server, its signal handling replaced: ``on_signal`` runs, then the graceful shutdown."""

    def __init__(self, config: uvicorn.Config, on_signal, on_second_interrupt):
        super().__init__(config)
        self.on_signal, self.on_second_interrupt = on_signal, on_second_interrupt
        self.interrupts = 0

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, sig, frame) -> None:
        if sig == signal.SIGINT and self.should_exit:
            self.interrupts += 1
            if self.interrupts == 1:  # a second Ctrl-C: end the requests in flight at their next token
                self.on_second_interrupt()
            else:  # a third: stop waiting for them
                self.force_exit = True
            return
        self.on_signal()
        self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: one the system picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_app(app, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve ``app`` on ``sock`` until SIGTERM / SIGINT, then shut down gracefully (see the module docstring)."""

    def stop_intake() -> None:
        engine = getattr(app.state, "engine", None)
        if engine is not None:
            engine.stop_intake()
        print("looplab serve: shutting down, finishing the requests in flight", file=sys.stderr, flush=True)

    def cancel_requests() -> None:
        engine = getattr(app.state, "engine", None)
        if engine is not None:
            engine.cancel_all()
        print("looplab serve: ending the requests in flight now (Ctrl-C again: stop waiting)", file=sys.stderr,
              flush=True)  # fmt: skip

    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=None)
    _Server(config, stop_intake, cancel_requests).run(sockets=[sock])
