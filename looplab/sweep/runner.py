"""Run a sweep: skip finished points, run the rest on local worker processes or Ray tasks.

Each point writes only inside its own ``runs/<id>``, and every file there is
written atomically, so the sweep may be killed at any moment: re-running the
same command skips the finished points and resumes the others from their
latest checkpoints, and every point ends up in the results exactly once.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from looplab.errors import LooplabError
from looplab.io import atomic_write
from looplab.sweep.results import RUNS_DIR, write_results
from looplab.sweep.run_point import PointJob, is_done, run_point
from looplab.sweep.spec import SweepSpec

BACKENDS = ("local", "ray")
RESULTS_EVERY_S = 10.0

OnResult = Callable[[PointJob, dict | None, BaseException | None], None]


class SweepIncomplete(LooplabError):
    """Some points failed; the finished ones are kept and a re-run retries the rest."""

    exit_code = 1


def run_sweep(spec: SweepSpec, out: str | Path, workers: int = 1, backend: str = "local",
              address: str | None = None, progress: bool = True, sweep_text: str | None = None):
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
    out = Path(out)
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    if sweep_text is not None:
        atomic_write(out / "sweep.toml", lambda p: p.write_text(sweep_text))
    points = spec.points()
    jobs = [PointJob(str(out / RUNS_DIR / p.run_id), p.config_toml, spec.scaling, spec.analyze, spec.analyze_loops,
                     spec.evaluate, spec.analyze_samples, spec.mlp_ablation)
            for p in points if not is_done(out / RUNS_DIR / p.run_id)]
    bar = tqdm(total=len(points), initial=len(points) - len(jobs), desc="sweep", unit="run",
               disable=None if progress else True, dynamic_ncols=True)
    failures: list[str] = []
    last_write = time.monotonic()

    def on_result(job: PointJob, result: dict | None, error: BaseException | None) -> None:
        nonlocal last_write
        bar.update(1)
        if error is not None:
            failures.append(f"{Path(job.run_dir).name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
        elif time.monotonic() - last_write > RESULTS_EVERY_S:
            write_results(out, points)  # a partial table to watch while the sweep runs
            last_write = time.monotonic()

    try:
        if backend == "ray":
            _run_ray(jobs, address, on_result)
        else:
            _run_local(jobs, workers, on_result)
    finally:
        bar.close()
    frame = write_results(out, points)
    if failures:
        raise SweepIncomplete(f"{len(failures)} of {len(points)} runs failed ({'; '.join(failures[:3])}); "
                              "re-run the same command to retry them")
    return frame


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _run_local(jobs: list[PointJob], workers: int, on_result: OnResult) -> None:
    """In this process when ``workers == 1``, else in spawned worker processes."""
    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            _guarded(job, on_result, lambda: run_point(job))
        return
    # spawn, not fork: a forked child of a process that already ran torch can deadlock in OpenMP.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context, initializer=_one_thread) as pool:
        futures = {pool.submit(run_point, job): job for job in jobs}
        for future in as_completed(futures):
            _guarded(futures[future], on_result, future.result)


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
                _guarded(pending.pop(ref), on_result, lambda: ray.get(ref))
    finally:
        ray.shutdown()


def _guarded(job: PointJob, on_result: OnResult, get: Callable[[], dict]) -> None:
    try:
        result = get()
    except Exception as error:  # one failed point must not stop the others; it is reported at the end
        on_result(job, None, error)
        return
    on_result(job, result, None)

