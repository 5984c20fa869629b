"""Stop signals are recorded, shared by nested blocks, and their handlers restored (looplab/train/stop.py)."""

from __future__ import annotations

import os
import signal

import pytest

from looplab.train.stop import TrainingStopped, signal_exit_code, stop_on_signals


def test_a_signal_is_recorded_not_fatal_and_the_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)  # the first signal names the request
        assert stop.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_nested_blocks_share_the_outer_request():
    with stop_on_signals() as outer:
        os.kill(os.getpid(), signal.SIGUSR1)  # before the inner block starts (a point between jobs)
        with stop_on_signals() as inner:
            assert inner is outer and inner.signal_name == "SIGUSR1"
    with stop_on_signals() as fresh:
        assert not fresh.requested


def test_a_second_ctrl_c_interrupts_at_once():
    with pytest.raises(KeyboardInterrupt), stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal_name == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGINT", 130), ("SIGUSR1", 128 + signal.SIGUSR1)])
def test_exit_code_is_the_shells_for_that_signal(name, code):
    assert signal_exit_code(name) == code
    stopped = TrainingStopped(name, 40, "run/checkpoints/step_0000040")
    assert stopped.exit_code == code and str(stopped).startswith(f"stopped by {name} after step 40;")
