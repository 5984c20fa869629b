"""Stopping a run when its scheduler asks: a signal ends training at the next step boundary, after a checkpoint.

SLURM, Kubernetes and Ray send SIGTERM some seconds before they kill a job (preemption,
a wall-time limit); SLURM can send SIGUSR1 earlier (``--signal=USR1@60``); Ctrl-C sends
SIGINT. Under :func:`stop_on_signals` each of them only sets a flag; the training loop
reads it after every step, saves a checkpoint and raises :class:`TrainingStopped`, so the
same command resumes bit for bit. A second SIGINT while the first is being honoured
raises KeyboardInterrupt at once (for a step that takes too long).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from looplab.errors import LooplabError

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


class StopRequest:
    """The first stop signal received (its name), or None; also the signal handler that records it."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __call__(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name == "SIGINT" and name == "SIGINT":
            raise KeyboardInterrupt
        self.signal_name = self.signal_name or name


_active: StopRequest | None = None


@contextmanager
def stop_on_signals(names: tuple[str, ...] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """Record ``names`` in a :class:`StopRequest` instead of dying of them, until the block ends.

    Nested blocks share the outermost request, so a signal that arrives before training starts
    (a sweep point between its jobs) still stops the training that follows. Signal handlers can
    only be set from the main thread: elsewhere (a Ray task's thread) the request never fires and
    the signals keep their previous handling.
    """
    global _active
    if _active is not None:
        yield _active
        return
    request = StopRequest()
    previous = _install(request, names)
    _active = request
    try:
        yield request
    finally:
        _active = None
        for number, handler in previous.items():
            signal.signal(number, handler)


def stop_on_signals_for_this_process() -> StopRequest:
    """Record the stop signals for the rest of this process's life (a sweep worker): a signal that
    arrives between two points stops the next one at its first step, instead of being forgotten."""
    global _active
    _active = StopRequest()
    _install(_active, STOP_SIGNALS)
    return _active


def _install(request: StopRequest, names: tuple[str, ...]) -> dict:
    """``request`` as the handler of ``names`` (main thread only); the handlers it replaced."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in names:
            number = getattr(signal, name, None)  # SIGUSR1 does not exist on Windows
            if number is not None:
                previous[number] = signal.signal(number, request)
    return previous


def signal_exit_code(name: str) -> int:
    """128 + the signal's number: the code a shell gives a process killed by that signal."""
    return 128 + int(getattr(signal, name, signal.SIGTERM))


class Stopped(LooplabError):
    """Asked to stop by a signal, with what was done saved: not a failure, and the same command resumes.
    Its exit code is the shell's for that signal."""

    def __init__(self, message: str, signal_name: str = "SIGTERM"):
        super().__init__(message)
        self.exit_code = signal_exit_code(signal_name)


class TrainingStopped(Stopped):
    """Training stopped on a signal after saving a checkpoint at ``step``; the same command resumes it."""

    def __init__(self, signal_name: str, step: int, where: str):
        super().__init__(
            f"stopped by {signal_name} after step {step}; checkpoint saved in {where}; "
            "run the same command again to resume",
            signal_name,
        )
        self.signal_name, self.step, self.where = signal_name, step, where

    def __reduce__(self):  # raised in a sweep worker, re-raised in the sweep's process
        return type(self), (self.signal_name, self.step, self.where)
