"""``looplab analyze``: analyses of a trained run, written to ``RUN_DIR/analysis/`` (or ``--out``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from looplab.analysis.pca import plot_trajectories, trajectory_pca
from looplab.errors import LooplabError
from looplab.experiment import Experiment
from looplab.seeding import derive_generator
from looplab.stability.spectral import EXACT_MAX_DIM, plot_spectral, spectral_trajectory
from looplab.tasks import TaskBatch


def _prepare(
    run_dir: str | Path, out: str | Path | None, length: int | None, loops: int | None, samples: int
) -> tuple[Experiment, TaskBatch, int, Path]:
    """Load the run, draw ``samples`` instances of ``length`` (default: the longest training length)."""
    exp = Experiment.from_run(run_dir)
    cfg = exp.config
    length = cfg.task.train_max if length is None else length
    loops = cfg.eval.max_loops if loops is None else loops
    if min(length, loops, samples) < 1:
        raise LooplabError("--length, --loops and --samples must be >= 1")
    device = next(exp.model.parameters()).device
    batch = exp.task.sample(length, samples, derive_generator(cfg.run.seed, "analysis", length)).to(device)
    out = Path(out) if out else Path(run_dir) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    return exp, batch, loops, out


def analyze_spectral(run_dir, length=None, loops=None, samples=4, iters=50, out=None) -> dict:
    """ρ of the loop Jacobian along the trajectory → spectral.csv, spectral.png; returns a summary."""
    exp, batch, loops, out = _prepare(run_dir, out, length, loops, samples)
    exact = batch.tokens.shape[1] * exp.config.model.d_model <= EXACT_MAX_DIM
    generator = derive_generator(exp.config.run.seed, "spectral")
    frame = spectral_trajectory(exp.model, batch, loops, iters, exact, generator)
    frame.to_csv(out / "spectral.csv", index=False)
    plot_spectral(frame, out / "spectral.png", f"{Path(run_dir).name}: loop Jacobian, n = {batch.lengths[0]}")
    per_loop = frame.groupby("loop")["rho_power"].mean()
    summary = {
        "rho_power_first": float(per_loop.iloc[0]),
        "rho_power_last": float(per_loop.iloc[-1]),
        "rho_power_max": float(per_loop.max()),
    }
    if exact:
        exact_last = frame.groupby("loop")["rho_exact"].mean()
        summary["rho_exact_last"] = float(exact_last.iloc[-1])
    (out / "spectral.json").write_text(json.dumps(summary, indent=2))
    return summary


def analyze_pca(run_dir, length=None, loops=None, sample=0, out=None) -> dict:
    """PCA of one sample's per-position trajectory → pca_2d.png, pca_3d.png; returns explained variance."""
    exp, batch, loops, out = _prepare(run_dir, out, length, loops, sample + 1)
    with torch.no_grad():
        states = torch.stack([h[sample] for h, _ in exp.model.unroll(batch.tokens, batch.valid, loops)])
    coords, explained = trajectory_pca(states[:, batch.valid[sample]].cpu())
    title = f"{Path(run_dir).name}: n = {int(batch.lengths[sample])}, loops 1..{loops}"
    plot_trajectories(coords, explained, out / "pca_2d.png", out / "pca_3d.png", title)
    return {"explained_variance": [float(v) for v in explained]}
