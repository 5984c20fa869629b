"""``looplab train --nproc N``: data-parallel training without calling torchrun by hand.

The config is loaded and checked here, once, before any process starts (a batch size
that does not split over N is one line, and nothing is launched). Then torchrun's own
launcher (``torch.distributed.run``, single node, a free port) starts N copies of
``looplab train`` without ``--nproc``; each rank prints its own lines as under
torchrun. When ranks fail, this process ends in one line with the first failure's
exit code, instead of torchrun's traceback; ranks stopped by a signal (checkpointed,
resumable) end with that signal's code and no error line.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from looplab.checkpoint import latest_checkpoint
from looplab.config import Config
from looplab.errors import LooplabError
from looplab.train.distributed import check_world_size
from looplab.train.stop import Stopped, StopRequest, signal_exit_code

#: exit codes of ranks that stopped on a signal after saving (see looplab.train.stop.Stopped)
STOP_CODES = {signal_exit_code(name) for name in ("SIGTERM", "SIGINT", "SIGUSR1")}


def launch(config: Config, nproc: int, train_argv: list[str], run_dir: Path, stop: StopRequest | None = None) -> int:
    """Train ``config`` on ``nproc`` local processes running ``looplab train_argv`` into ``run_dir``; returns the
    exit code.

    Raises:
        LooplabError: ``nproc`` < 1, a batch size that does not split over it, or failed ranks.
        Stopped: the launcher was signalled before the ranks had saved anything: before they started (``stop``
            records the signals that reached this process so far) or while they were still importing.
    """
    if nproc < 1:
        raise LooplabError(f"--nproc must be >= 1, got {nproc}")
    check_world_size(config.train.batch_size, nproc)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for its ranks, without its warning
    arguments = parse_args(["--standalone", f"--nproc_per_node={nproc}", "-m", "looplab", *train_argv])

    def newest() -> Path | None:
        return latest_checkpoint(run_dir) if run_dir.is_dir() else None

    saved = newest()

    def not_begun(signal_name: str) -> Stopped:
        return Stopped(f"stopped by {signal_name} before training began; nothing new was saved", signal_name)

    if stop is not None and stop.requested:
        raise not_begun(stop.signal_name)

    # its lines repeat what the ranks print (failures, a signal passed on); each module has its own logger
    quiet = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed.elastic")
    ]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)

    def refuse(signum: int, _frame) -> None:  # until torchrun's agent starts the ranks and takes the signals over
        raise not_begun(signal.Signals(signum).name)

    previous = {number: signal.signal(number, refuse) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        run(arguments)
    except SignalException as signalled:  # the launcher was signalled and passed it on: the ranks saved and stopped
        name = signal.Signals(signalled.sigval).name
        if newest() == saved:  # they had not begun: say so
            raise not_begun(name) from None
        return signal_exit_code(name)
    except ChildFailedError as failed:
        codes = {failure.exitcode for failure in failed.failures.values()}
        ended = STOP_CODES | {-signal.SIGTERM}  # stopped and saved, or ended by the launcher's SIGTERM after that
        if codes & STOP_CODES and codes <= ended:
            return max(codes)
        # ranks ended by the launcher (a negative code: its signal) only followed the one that failed
        first = {rank: f for rank, f in failed.failures.items() if f.exitcode > 0} or failed.failures
        rank, failure = min(first.items())
        error = LooplabError(f"training failed on rank {rank} of {nproc} (exit code {failure.exitcode}); see above")
        error.exit_code = failure.exitcode
        raise error from None
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    return 0
