"""``looplab analyze``: analyses of a trained run, written to ``RUN_DIR/analysis/`` (or ``--out``)."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import torch

from looplab.analysis.pca import plot_trajectories, trajectory_pca
from looplab.analysis.text import start_line
from looplab.errors import LooplabError
from looplab.experiment import Experiment, check_sizes, training_depth
from looplab.memory import check_fits, probe_bytes
from looplab.model.protocol import LoopedModel
from looplab.progress import Progress
from looplab.seeding import derive_generator
from looplab.stability.spectral import EXACT_MAX_DIM, default_exact_loops, plot_spectral, spectral_trajectory
from looplab.tasks import TaskBatch


def _prepare(
    run_dir: str | Path,
    out: str | Path | None,
    length: int | None,
    loops: int | None,
    samples: int,
    kind: str,
) -> tuple[Experiment, TaskBatch, int, Path]:
    """Load the run, draw ``samples`` instances of ``length`` (default: the longest training length); the
    output folder is named, not created (callers create it once their arguments are checked). The size, loops
    and samples are checked first: against the task's sizes, and against memory for the ``kind`` of probe
    (``spectral``: a table row per sample and loop; ``pca``: one sample's state per loop)."""
    exp = Experiment.from_run(run_dir)
    cfg = exp.config
    length = cfg.task.train_max if length is None else length
    loops = cfg.eval.max_loops if loops is None else loops
    if min(length, loops, samples) < 1:
        raise LooplabError("--length, --loops and --samples must be >= 1")
    check_sizes(exp.task, "--length", [length])
    state = exp.task.seq_len(length) * cfg.model.d_model
    kept, rows = (0, samples) if kind == "spectral" else (state, 0)
    check_fits(
        f"a {kind} analysis of {samples} sample(s) of size {length} x {loops} loops",
        probe_bytes(cfg, exp.task, length, samples, loops, kept, rows),
        cfg.run.device,
        "use a smaller --length, fewer --loops or " + ("--samples" if kind == "spectral" else "a lower --sample"),
    )
    device = next(exp.model.parameters()).device
    batch = exp.task.sample(length, samples, derive_generator(cfg.run.seed, "analysis", length)).to(device)
    return exp, batch, loops, Path(out) if out else Path(run_dir) / "analysis"


def _start_line(kind: str, run_dir, exp: Experiment, batch: TaskBatch, loops: int) -> None:
    print(start_line(kind, str(run_dir), exp.checkpoint, len(batch.tokens), int(batch.lengths[0]), loops), flush=True)


def analyze_spectral(
    run_dir,
    length=None,
    loops=None,
    samples=4,
    iters=10,
    out=None,
    exact_loops: Collection[int] | None = None,
    progress: bool = False,
) -> dict:
    """ρ of the loop Jacobian along the trajectory → spectral.csv, spectral.png, spectral.json; returns the summary.

    ``exact_loops``: where to compute the exact spectrum as well (default: the first, middle and
    last loop; only for states of at most ``EXACT_MAX_DIM`` numbers, L·d).
    """
    exp, batch, loops, out = _prepare(run_dir, out, length, loops, samples, "spectral")
    exact = checked_exact_loops(exact_loops, loops, batch.tokens.shape[1], exp.config.model.d_model)
    if progress:
        _start_line("spectral", run_dir, exp, batch, loops)
    title = f"{Path(run_dir).name}: loop Jacobian, n = {batch.lengths[0]}"
    generator = derive_generator(exp.config.run.seed, "spectral")
    return write_spectral(
        exp.model, batch, loops, iters, exact, generator, out, title, training_depth(exp.config), progress
    )


def checked_exact_loops(exact_loops: Collection[int] | None, loops: int, length: int, width: int) -> list[int]:
    """The loops where the exact spectrum is computed: ``exact_loops``, or by default the first, middle and
    last loop when the state (``length`` × ``width`` numbers) is small enough; one-line errors otherwise."""
    small = length * width <= EXACT_MAX_DIM
    if exact_loops is None:
        return list(default_exact_loops(loops)) if small else []
    if exact_loops and not small:
        raise LooplabError(
            f"the exact spectrum needs a state of at most {EXACT_MAX_DIM} numbers (L·d); this one has "
            f"{length} × {width}: drop --exact-at or ask for a shorter --length"
        )
    beyond = sorted(t for t in exact_loops if not 1 <= t <= loops)
    if beyond:
        raise LooplabError(f"--exact-at loops {beyond} lie outside 1..{loops} (--loops)")
    return list(exact_loops)


def write_spectral(
    model: LoopedModel,
    batch: TaskBatch,
    loops: int,
    iters: int,
    exact_loops: Collection[int],
    generator: torch.Generator,
    out: Path,
    title: str,
    depth: int | None,
    progress: bool = False,
) -> dict:
    """ρ along one trajectory of any model of the looped-model protocol on ``batch`` (its tokens and valid
    mask) → ``out``/spectral.csv, spectral.png, spectral.json; returns the summary (``depth``: the
    training depth the plot marks, or None)."""
    out.mkdir(parents=True, exist_ok=True)
    with Progress("spectral", loops, unit="loop", enabled=progress) as bar:
        frame = spectral_trajectory(model, batch, loops, iters, set(exact_loops), generator, bar)
    frame.to_csv(out / "spectral.csv", index=False)
    plot_spectral(frame, out / "spectral.png", title, depth)
    per_loop = frame.groupby("loop")["rho_power"].mean()
    summary = {
        "length": int(batch.lengths[0]),
        "samples": len(batch.tokens),
        "loops": loops,
        "iters": iters,
        "rho_power_first": float(per_loop.iloc[0]),
        "rho_power_last": float(per_loop.iloc[-1]),
        "rho_power_max": float(per_loop.max()),
        "rho_power_max_loop": int(per_loop.idxmax()),
        "rho_exact": {str(t): float(v) for t, v in frame.groupby("loop")["rho_exact"].mean().dropna().items()},
    }
    # a model whose injection is a recurrence of its own (Parcae's diagonal decay) reports that recurrence's ρ
    radius = getattr(model, "injection_radius", None)
    radius = None if radius is None else radius()
    if radius is not None:
        summary["injection_radius"] = radius
    (out / "spectral.json").write_text(json.dumps(summary, indent=2))
    return summary


def format_spectral(summary: dict) -> str:
    """The lines ``looplab analyze spectral`` prints."""
    lines = [
        f"spectral radius of the loop Jacobian, n = {summary['length']}, mean over {summary['samples']} samples, "
        f"loops 1..{summary['loops']} (power iteration, warm-started, {summary['iters']} iterations per loop):",
        f"  loop 1: {summary['rho_power_first']:.3f}   loop {summary['loops']}: {summary['rho_power_last']:.3f}   "
        f"max: {summary['rho_power_max']:.3f} at loop {summary['rho_power_max_loop']}",
    ]
    if summary["rho_exact"]:
        shown = list(summary["rho_exact"].items())
        cells = [f"loop {t}: {value:.3f}" for t, value in shown]
        if len(cells) > 6:  # every loop was asked for: the ends, the rest is in spectral.csv
            cells = [*cells[:3], "…", *cells[-3:]]
        lines.append(f"  exact eigenvalues: {'   '.join(cells)}")
    if "injection_radius" in summary:
        lines.append(
            f"  the injection's own recurrence (its diagonal decay): ρ = {summary['injection_radius']:.3f}, beside "
            "the whole loop map's above"
        )
    return "\n".join(lines)


def analyze_pca(run_dir, length=None, loops=None, sample=0, out=None, progress: bool = False) -> dict:
    """PCA of one sample's per-position trajectory → pca_2d.png, pca_3d.png; returns explained variance."""
    exp, batch, loops, out = _prepare(run_dir, out, length, loops, sample + 1, "pca")
    out.mkdir(parents=True, exist_ok=True)
    if progress:
        _start_line("pca", run_dir, exp, batch, loops)
    states = []
    with torch.no_grad(), Progress("pca", loops, unit="loop", enabled=progress) as bar:
        for h, _ in exp.model.unroll(batch.tokens, batch.valid, loops):
            states.append(h[sample])
            bar.advance()
    states = torch.stack(states)
    coords, explained = trajectory_pca(states[:, batch.valid[sample]].cpu())
    title = f"{Path(run_dir).name}: n = {int(batch.lengths[sample])}, loops 1..{loops}"
    plot_trajectories(coords, explained, out / "pca_2d.png", out / "pca_3d.png", title)
    return {"explained_variance": [float(v) for v in explained]}
