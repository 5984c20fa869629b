"""Run a sweep: skip finished points, run the rest on local worker processes or Ray tasks.

Each point writes only inside its own ``runs/<id>``, and every file there is
written atomically, so the sweep may be killed at any moment: re-running the
same command skips the finished points and resumes the others from their
latest checkpoints, and every point ends up in the results exactly once.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from functools import partial
from pathlib import Path

from tqdm import tqdm

from looplab.errors import LooplabError
from looplab.io import atomic_write, exclusive_lock, read_utf8_text
from looplab.progress import ProgressLines
from looplab.rundir import CONFIG_FILE, SWEEP_FILE, read_log
from looplab.sweep.results import RUNS_DIR, write_results
from looplab.sweep.run_point import PointJob, is_done, run_point
from looplab.sweep.spec import SweepSpec
from looplab.train.stop import (
    Stopped,
    TrainingStopped,
    stop_on_signals,
    stop_on_signals_for_this_process,
)

BACKENDS = ("local", "ray")
RESULTS_EVERY_S = 10.0
RAY_CONNECT_TIMEOUT_S = 10.0
STOP_POLL_S = 0.5  # how often the local runner looks for a stop signal while points run
PR_SET_PDEATHSIG = 1

OnResult = Callable[[PointJob, dict | None, BaseException | None], None]


class SweepIncomplete(LooplabError):
    """Some points failed; the finished ones are kept and a re-run retries the rest."""

    exit_code = 1


class SweepStopped(Stopped):
    """The sweep was asked to stop by a signal; its running points checkpointed, a re-run resumes them."""

    def __init__(self, signal_name: str, finished: int, stopped: int, total: int):
        super().__init__(
            f"stopped by {signal_name}: {finished} of {total} runs finished, {stopped} stopped after a checkpoint; "
            "run the same command again to resume",
            signal_name,
        )
        self.signal_name = signal_name


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    sweep_text: str | None = None,
):
    """Run every unfinished point of ``spec`` under ``out`` and write ``out/results.parquet``.

    Args:
        workers: local worker processes (one torch thread each); ignored by Ray,
            which schedules one CPU per point on its cluster.
        address: the Ray cluster to join (``ray://…`` or ``host:port``); None starts a local one.
        sweep_text: the sweep file's text, kept as ``out/sweep.toml`` for the record.

    Returns:
        the results table (a pandas DataFrame).
    """
    if backend not in BACKENDS:
        raise LooplabError(f"unknown backend {backend!r}; valid choices: {', '.join(BACKENDS)}")
    if workers < 1:
        raise LooplabError(f"--workers must be >= 1, got {workers}")
    if backend == "ray" and address:
        _check_reachable(address)  # before anything is written
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LooplabError(f"--out {out} is a file, not a sweep dir")
    if (out / CONFIG_FILE).is_file():
        raise LooplabError(f"--out {out} is a run dir (it holds {CONFIG_FILE}); a sweep needs a dir of its own")
    with exclusive_lock(out, "sweep dir"):
        _check_same_sweep(out, sweep_text)
        (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
        if sweep_text is not None:
            atomic_write(out / SWEEP_FILE, lambda p: p.write_text(sweep_text))
        return _run_points(spec, out, workers, backend, address, progress)


class StepWatcher:
    """Moves the sweep bar while runs train: every few seconds it sums the training steps logged so far
    by the unfinished runs (their log.jsonl) and shows them beside the count of finished runs."""

    def __init__(self, jobs: list[PointJob], bar: tqdm, every_s: float = 2.0):
        self.run_dirs = [Path(job.run_dir) for job in jobs]
        self.total = sum(tomllib.loads(job.config_toml)["train"]["steps"] for job in jobs)
        self.bar, self.every_s = bar, every_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopped.wait(self.every_s):
            done = sum(next((r["step"] for r in reversed(read_log(d)) if "step" in r), 0) for d in self.run_dirs)
            self.bar.set_postfix_str(f"training steps {done}/{self.total}")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def link_tensorboard_runs(out: Path, points) -> None:
    """``out/tensorboard/<task>-<variant>-seed<N>`` → each run's TensorBoard folder, so that
    ``tensorboard --logdir out/tensorboard`` names runs by what they are, not by hash."""
    folder = out / "tensorboard"
    for point in points:
        target = out / RUNS_DIR / point.run_id / "tensorboard"
        if not target.is_dir():
            continue
        config = tomllib.loads(point.config_toml)
        name = f"{config['task']['name']}-{point.variant}-seed{config['run']['seed']}"
        link = folder / re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name)
        folder.mkdir(exist_ok=True)
        if not (link.exists() or link.is_symlink()):  # a copied sweep dir may hold the folder itself
            link.symlink_to(os.path.relpath(target, folder))


def _check_same_sweep(out: Path, sweep_text: str | None) -> None:
    """Refuse to run a different sweep file into a sweep dir that already holds one."""
    saved = out / SWEEP_FILE
    if saved.exists() and not saved.is_file():
        raise LooplabError(f"sweep dir {out}: {saved} is not a file; use a new --out")
    if sweep_text is not None and saved.is_file() and read_utf8_text(saved, "the sweep dir's sweep file") != sweep_text:
        raise LooplabError(
            f"sweep dir {out} holds a different sweep ({saved} differs from this sweep file); use a new --out"
        )


def _run_points(spec: SweepSpec, out: Path, workers: int, backend: str, address: str | None, progress: bool):
    """The body of :func:`run_sweep`, under the sweep dir's lock."""
    points = spec.points()
    every = [
        PointJob(
            str(out / RUNS_DIR / p.run_id),
            p.config_toml,
            spec.options.scaling,
            spec.options.evaluate,
            spec.analysis_options(),
        )
        for p in points
    ]
    jobs = [job for job in every if not is_done(job)]
    bar = tqdm(
        total=len(points),
        initial=len(points) - len(jobs),
        desc="sweep",
        unit="run",
        disable=None if progress else True,
        dynamic_ncols=True,
    )
    lines = ProgressLines("sweep", len(points), len(points) - len(jobs), enabled=progress)
    watcher = StepWatcher(jobs, bar) if progress and not bar.disable else None
    failures: list[str] = []
    failed: set[str] = set()  # run ids
    stopped: list[str] = []
    last_write = time.monotonic()
    finished = len(points) - len(jobs)  # counted here: a disabled bar (off a terminal) does not count

    def on_result(job: PointJob, result: dict | None, error: BaseException | None) -> None:
        nonlocal last_write, finished
        if isinstance(error, TrainingStopped):  # checkpointed on a stop signal: resumed by a re-run
            stopped.append(Path(job.run_dir).name)
            return
        finished += 1
        bar.update(1)
        lines.update(finished, f"last: {Path(job.run_dir).name} ({'failed' if error else 'done'})")
        if error is not None:
            failed.add(Path(job.run_dir).name)
            failures.append(
                f"{Path(job.run_dir).name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            )
        elif time.monotonic() - last_write > RESULTS_EVERY_S:
            write_results(out, points)  # a partial table to watch while the sweep runs
            last_write = time.monotonic()

    # pretrained points first (a sweep with `pretrain`), then the fine-tunes of those that finished
    pretrained = {p.after for p in points if p.after}
    after = {str(out / RUNS_DIR / p.run_id): p.after for p in points}
    phases = [
        [j for j in jobs if Path(j.run_dir).name in pretrained],
        [j for j in jobs if Path(j.run_dir).name not in pretrained],
    ]
    stop_signal = None
    try:
        for phase in phases:
            for job in [j for j in phase if after[j.run_dir] in failed]:
                on_result(job, None, LooplabError(f"its pretrained run {after[job.run_dir]} failed"))
            phase = [j for j in phase if after[j.run_dir] not in failed]
            if not phase:
                continue
            if backend == "ray":
                _run_ray(phase, address, on_result)
            else:
                stop_signal = _run_local(phase, workers, on_result)
            if stop_signal is not None or stopped:
                break
    finally:
        if watcher is not None:
            watcher.stop()
        bar.close()
    frame = write_results(out, points)
    link_tensorboard_runs(out, points)
    frame.attrs["ran"] = len(jobs)  # runs this call trained (0: the sweep was already done)
    if stop_signal is not None or stopped:
        raise SweepStopped(stop_signal or "a signal", finished, len(stopped), len(points))
    if failures:
        raise SweepIncomplete(
            f"{len(failures)} of {len(points)} runs failed ({'; '.join(failures[:3])}); "
            "re-run the same command to retry them"
        )
    return frame


def _worker_init() -> None:
    """One torch thread per worker, stop signals recorded for its whole life, and a worker dies with the
    sweep process that spawned it.

    Linux's PR_SET_PDEATHSIG delivers SIGKILL when the parent dies (even by SIGKILL),
    so a killed sweep leaves no orphan training on; a re-run resumes the points.
    """
    import torch

    torch.set_num_threads(1)
    stop_on_signals_for_this_process()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the request took effect
            os._exit(1)


def _run_local(jobs: list[PointJob], workers: int, on_result: OnResult) -> str | None:
    """In this process when ``workers == 1``, else in spawned worker processes; returns the name of
    the stop signal that ended it early (None when every job ran).

    On SIGTERM, SIGINT or SIGUSR1 no new point starts, and the running points are sent SIGTERM:
    each checkpoints at its next step and stops (:mod:`looplab.train.stop`).
    """
    with stop_on_signals() as stop:
        if workers == 1 or len(jobs) <= 1:
            for job in jobs:  # the training in this process reads the same stop request
                if stop.requested:
                    break
                _guarded(job, on_result, partial(run_point, job))
            return stop.signal_name
        # spawn, not fork: a forked child of a process that already ran torch can deadlock in OpenMP.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context, initializer=_worker_init) as pool:
            futures = {pool.submit(run_point, job): job for job in jobs}
            pending, forwarded = set(futures), False
            while pending:
                done, pending = wait(pending, timeout=STOP_POLL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    if not future.cancelled():
                        _guarded(futures[future], on_result, future.result)
                if stop.requested and not forwarded:
                    forwarded = True
                    for future in pending:
                        future.cancel()  # not started yet: nothing to save
                    for child in multiprocessing.active_children():
                        os.kill(child.pid, signal.SIGTERM)  # Ctrl-C may have reached them already
        return stop.signal_name


def _run_ray(jobs: list[PointJob], address: str | None, on_result: OnResult) -> None:
    """One Ray task (one CPU) per point; the run dirs must be on storage every node can reach."""
    try:
        import ray
    except ImportError:
        raise LooplabError("the ray backend needs Ray, which is not installed: pip install 'looplab[ray]'") from None
    try:
        # A new local cluster needs no dashboard; an existing one rejects the option.
        ray.init(address=address, log_to_driver=False, **({} if address else {"include_dashboard": False}))
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise LooplabError(f"cannot reach the Ray cluster at {address}: {str(err).splitlines()[0]}") from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
        pending = {remote.remote(job): job for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                _guarded(pending.pop(ref), on_result, partial(ray.get, ref))
    finally:
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """Fail within seconds when nothing answers at a ``host:port`` (or ``ray://host:port``) address;
    Ray itself would retry for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms are Ray's to resolve
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise LooplabError(f"cannot reach the Ray cluster at {address}: {err.strerror or err}") from None


def _guarded(job: PointJob, on_result: OnResult, get: Callable[[], dict]) -> None:
    try:
        result = get()
    except Exception as error:  # one failed point must not stop the others; it is reported at the end
        on_result(job, None, error)
        return
    on_result(job, result, None)
