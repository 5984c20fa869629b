"""The mechanistic analysis of a looped model (docs/methods.md §7), written to ``RUN_DIR/analysis/mechanistic``.

:func:`analyze_mechanistic` reads a run's latest checkpoint; :func:`analyze_config`
analyses the model a config initialises, untrained (the run's seed decides the
weights), as the paper's norm × injection ablation does.

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

from looplab.analysis.attention import attention_difference, consecutive_attention_difference, lipschitz_check
from looplab.analysis.colsum import colsum_depth, colsum_trace
from looplab.analysis.dynamics import token_dynamics
from looplab.analysis.fixed_points import (convergence, fixed_point_cross_cos_min, late_self_cos, layer_cosines,
                                           self_convergence, state_norms, update_ratios)
from looplab.analysis.massive import massive_activations, zero_mlp
from looplab.analysis.plots import (ATTENTION_PANELS, plot_attention_difference, plot_colsum_depth, plot_convergence,
                                    plot_cosine_matrix)
from looplab.analysis.trace import trace
from looplab.config import Config
from looplab.errors import LooplabError
from looplab.seeding import derive_generator
from looplab.train.trainer import Experiment

__all__ = ["analyze_mechanistic", "analyze_config", "analyze_experiment"]


def _write_csv(path: Path, header: list[str], rows) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _finite(value: float) -> float | None:
    """JSON-safe float: NaN/inf (e.g. cross-layer cosine of a one-layer core) become null."""
    return float(value) if math.isfinite(value) else None


def analyze_mechanistic(run_dir: str | Path, loops: int = 128, out: str | Path | None = None, samples: int = 8,
                        **options) -> dict:
    """Analyse ``run_dir``'s latest checkpoint; returns the summary (also in summary.json).

    ``out`` defaults to ``RUN_DIR/analysis/mechanistic``; ``options`` as for :func:`analyze_experiment`.
    """
    exp = Experiment.from_run(run_dir)
    out = Path(out) if out else Path(run_dir) / "analysis" / "mechanistic"
    return analyze_experiment(exp, out, loops, samples, label=Path(run_dir).name, **options)


def analyze_config(config: Config, out: str | Path, loops: int = 128, samples: int = 8, **options) -> dict:
    """Analyse the untrained model ``config`` initialises (seed ``run.seed``); returns the summary."""
    exp = Experiment.build(config)
    exp.model.eval()
    return analyze_experiment(exp, Path(out), loops, samples, label=Path(out).name, **options)


@torch.no_grad()
def analyze_experiment(exp: Experiment, out: Path, loops: int = 128, samples: int = 8, *, label: str = "",
                       window: int | None = None, tol: float = 1e-3, max_period: int = 8,
                       mlp_ablation: bool = True) -> dict:
    """Trace ``exp.model`` for ``loops`` loops and write every metric, table and plot to ``out``.

    Args:
        loops: loops r to unroll (the paper uses 128).
        samples: instances of the task at its longest training length.
        label: the name plot titles start with.
        window: last W loops for the token dynamics and ``fixed_point_self_cos``
            (default: max(2, loops // 4) and max(1, loops // 4)).
        tol, max_period: token-dynamics tolerance and largest orbit period searched.
        mlp_ablation: also re-trace with each core layer's MLP zeroed (one trace per layer).
    """
    if min(loops, samples) < 1:
        raise LooplabError("loops and samples must be >= 1")
    cfg, model = exp.config, exp.model
    length = cfg.task.train_max
    batch = exp.task.sample(length, samples, derive_generator(cfg.run.seed, "mechanistic", length))
    out.mkdir(parents=True, exist_ok=True)

    def run_trace():
        return trace(model, batch.tokens, batch.valid, loops, attention=True, dtype=torch.float32, device="cpu",
                     generator=derive_generator(cfg.run.seed, "mechanistic", "init"))

    recorded = run_trace()
    valid = recorded.valid
    states = recorded.states().double()                          # [r, k, B, T, d], converted once for every metric
    n_layers = states.shape[1]
    delta = convergence(states, valid)                           # [k, r−1]
    cosines = layer_cosines(states, valid)                       # [k, k]
    self_curves = self_convergence(states, valid, per_sample=True)  # [k, r, B]
    self_cos = self_curves.mean(-1)                              # [k, r]
    self_first, self_first_median = late_self_cos(self_curves[0])
    attn = recorded.attention()
    diff = attention_difference(attn[:, :ATTENTION_PANELS])      # [min(k, panels), r, r], for the heatmaps
    step_diff = consecutive_attention_difference(attn)          # [k, r−1]
    bound = lipschitz_check(model, recorded)
    colsum = colsum_trace(recorded)                              # [r, k, H]
    depth_values, depth_labels = colsum_depth(recorded, colsum)
    massive = massive_activations(states, valid)                 # [r, k]
    loop_states = recorded.loop_states()                         # [r, B, T, d]
    dynamics = token_dynamics(loop_states[:, valid], window=window or max(2, loops // 4), tol=tol,
                              max_period=max_period) if loops >= 2 else None
    norms = state_norms(loop_states, valid)                      # [r]
    ratios = update_ratios(states, valid)                        # [k − 1]
    ablation = []
    for layer in range(len(model.core) if mlp_ablation else 0):
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
               ((layer, t, float(step_diff[layer, t - 2]), float(bound.ratio[layer, t - 2].max()),
                 bool(bound.holds[layer, t - 2].all())) for layer in range(n_layers) for t in steps))
    _write_csv(out / "massive.csv", ["loop", "layer", "max_over_median"],
               ((t, layer, float(massive[t - 1, layer])) for t in range(1, loops + 1) for layer in range(n_layers)))

    plot_convergence(delta, out / "convergence.png", f"{label}: convergence Δ_(ℓ,t)")
    plot_cosine_matrix(cosines, out / "cosine_matrix.png", f"{label}: cos between layers, loop {loops}")
    plot_attention_difference(diff, out / "attention_difference.png", f"{label}: ‖A_t − A_t′‖_F")
    plot_colsum_depth(depth_values, depth_labels, out / "colsum_depth.png", f"{label}: ColSum over effective depth")

    summary = {
        "checkpoint": exp.checkpoint, "steps_trained": int(exp.checkpoint.split("_")[1]) if exp.checkpoint else 0,
        "loops": loops, "samples": samples, "length": length,
        "fixed_point_self_cos": _finite(self_first),
        "fixed_point_self_cos_median": _finite(self_first_median),
        "fixed_point_cross_cos_min": _finite(fixed_point_cross_cos_min(states, valid)),
        "state_norm_first": float(norms[0]), "state_norm_last": float(norms[-1]),
        "update_ratio_mean": float(ratios.mean()) if ratios.numel() else None,
        "update_ratio_last": ratios.tolist(),
        "convergence_last": [float(v) for v in delta[:, -1]] if loops >= 2 else [],
        "attention_diff_last": float(step_diff[:, -1].mean()) if loops >= 2 else 0.0,
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
