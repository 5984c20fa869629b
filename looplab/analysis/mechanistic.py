"""The mechanistic analysis of a trained run (SPEC §7), written to ``RUN_DIR/analysis/mechanistic``.

One traced forward (attention on, stored on CPU in float32) of ``samples``
instances at the longest training length, run for ``loops`` loops, feeds every
metric: convergence, distinct fixed points, attention differences and the
Lipschitz bound, ColSum concentration (per loop and over effective depth),
token dynamics of h_t over the last loops, massive activations, and the
MLP-zeroing ablation of each core layer (one more trace per layer).

Files: summary.json, convergence.csv, fixed_points.csv, layer_cosines.csv,
colsum.csv, attention.csv, massive.csv and convergence.png, cosine_matrix.png,
attention_difference.png, colsum_depth.png.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch

from looplab.analysis.attention import attention_difference, lipschitz_check
from looplab.analysis.colsum import colsum_depth, colsum_trace
from looplab.analysis.dynamics import token_dynamics
from looplab.analysis.fixed_points import (convergence, fixed_point_cross_cos_min, fixed_point_self_cos,
                                           layer_cosines, self_convergence)
from looplab.analysis.massive import massive_activations, zero_mlp
from looplab.analysis.plots import plot_attention_difference, plot_colsum_depth, plot_convergence, plot_cosine_matrix
from looplab.analysis.trace import trace
from looplab.errors import LooplabError
from looplab.seeding import derive_generator
from looplab.train.trainer import Experiment

__all__ = ["analyze_mechanistic"]


def _write_csv(path: Path, header: list[str], rows) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _finite(value: float) -> float | None:
    """JSON-safe float: NaN/inf (e.g. cross-layer cosine of a one-layer core) become null."""
    return float(value) if math.isfinite(value) else None


@torch.no_grad()
def analyze_mechanistic(run_dir: str | Path, loops: int = 128, out: str | Path | None = None, samples: int = 8,
                        window: int | None = None, tol: float = 1e-3, max_period: int = 8) -> dict:
    """Run the analysis on ``run_dir``'s latest checkpoint; returns the summary (also in summary.json).

    Args:
        loops: loops r to unroll (the paper uses 128).
        samples: instances of the task at its longest training length.
        window: last W loops for the token dynamics and ``fixed_point_self_cos``
            (default: max(2, loops // 4) and max(1, loops // 4)).
        tol, max_period: token-dynamics tolerance and largest orbit period searched.
    """
    if min(loops, samples) < 1:
        raise LooplabError("loops and samples must be >= 1")
    exp = Experiment.from_run(run_dir)
    cfg, model = exp.config, exp.model
    length = cfg.task.train_max
    batch = exp.task.sample(length, samples, derive_generator(cfg.run.seed, "mechanistic", length))
    out = Path(out) if out else Path(run_dir) / "analysis" / "mechanistic"
    out.mkdir(parents=True, exist_ok=True)

    def run_trace():
        return trace(model, batch.tokens, batch.valid, loops, attention=True, dtype=torch.float32, device="cpu",
                     generator=derive_generator(cfg.run.seed, "mechanistic", "init"))

    recorded = run_trace()
    valid = recorded.valid
    states = recorded.states()                                   # [r, k, B, T, d]
    n_layers = states.shape[1]
    delta = convergence(states, valid)                           # [k, r−1]
    cosines = layer_cosines(states, valid)                       # [k, k]
    self_cos = self_convergence(states, valid)                   # [k, r]
    diff = attention_difference(recorded.attention())            # [k, r, r]
    bound = lipschitz_check(model, recorded)
    colsum = colsum_trace(recorded)                              # [r, k, H]
    depth_values, depth_labels = colsum_depth(recorded)
    massive = massive_activations(states, valid)                 # [r, k]
    loop_states = recorded.loop_states()                         # [r, B, T, d]
    dynamics = token_dynamics(loop_states[:, valid], window=window or max(2, loops // 4), tol=tol,
                              max_period=max_period) if loops >= 2 else None
    ablation = []
    for layer in range(len(model.core)):
        with zero_mlp(model, layer):
            ablated = colsum_trace(run_trace())
        ablation.append({"layer": layer, "colsum_mean": float(colsum.mean()),
                         "colsum_mean_ablated": float(ablated.mean())})

    steps = range(2, loops + 1)
    _write_csv(out / "convergence.csv", ["layer", "loop", "delta"],
               ((layer, t, float(delta[layer, t - 2])) for layer in range(n_layers) for t in steps))
    _write_csv(out / "fixed_points.csv", ["layer", "loop", "cos_to_own_final_state"],
               ((layer, t, float(self_cos[layer, t - 1])) for layer in range(n_layers) for t in range(1, loops + 1)))
    _write_csv(out / "layer_cosines.csv", ["layer", *[f"layer{j}" for j in range(n_layers)]],
               ([i, *(float(v) for v in cosines[i])] for i in range(n_layers)))
    _write_csv(out / "colsum.csv", ["depth", "name", "head", "colsum"],
               ((i, name, head, float(depth_values[i, head])) for i, name in enumerate(depth_labels)
                for head in range(depth_values.shape[1])))
    _write_csv(out / "attention.csv", ["layer", "loop", "attn_diff_prev", "lipschitz_ratio_max", "bound_holds"],
               ((layer, t, float(diff[layer, t - 2, t - 1]), float(bound.ratio[layer, t - 2].max()),
                 bool(bound.holds[layer, t - 2].all())) for layer in range(n_layers) for t in steps))
    _write_csv(out / "massive.csv", ["loop", "layer", "max_over_median"],
               ((t, layer, float(massive[t - 1, layer])) for t in range(1, loops + 1) for layer in range(n_layers)))

    name = Path(run_dir).name
    plot_convergence(delta, out / "convergence.png", f"{name}: convergence Δ_(ℓ,t)")
    plot_cosine_matrix(cosines, out / "cosine_matrix.png", f"{name}: cos between layers, loop {loops}")
    plot_attention_difference(diff, out / "attention_difference.png", f"{name}: ‖A_t − A_t′‖_F")
    plot_colsum_depth(depth_values, depth_labels, out / "colsum_depth.png", f"{name}: ColSum over effective depth")

    summary = {
        "checkpoint": exp.checkpoint, "loops": loops, "samples": samples, "length": length,
        "fixed_point_self_cos": _finite(fixed_point_self_cos(states, valid)),
        "fixed_point_cross_cos_min": _finite(fixed_point_cross_cos_min(states, valid)),
        "convergence_last": [float(v) for v in delta[:, -1]] if loops >= 2 else [],
        "attention_diff_last": float(diff[:, -2, -1].mean()) if loops >= 2 else 0.0,
        "lipschitz": {"holds_fraction": float(bound.holds.double().mean()) if bound.holds.numel() else 1.0,
                      "ratio_max": float(bound.ratio.max()) if bound.ratio.numel() else 0.0,
                      "kappa": bound.kappa.tolist()},
        "colsum": {"mean": float(colsum.mean()), "last_loop_per_layer": colsum[-1].mean(-1).tolist(),
                   "mlp_ablation": ablation},
        "token_dynamics": None if dynamics is None else {**dynamics.fractions, "tokens": int(dynamics.labels.numel()),
                                                         "window": window or max(2, loops // 4), "tol": tol},
        "massive_ratio_max": float(massive.max()),
        "massive_ratio_last_loop": massive[-1].tolist(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
