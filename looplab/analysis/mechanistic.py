"""The mechanistic analysis of a looped model (docs/methods.md §7), written to ``RUN_DIR/analysis/mechanistic``.

:func:`analyze_mechanistic` reads a run's latest checkpoint; :func:`analyze_config`
analyses the model a config initialises, untrained (the run's seed decides the
weights), as the paper's norm × injection ablation does; :func:`analyze_model` is
the same analysis of any model of the looped-model protocol on given tokens (a
transformers looped LM on a user's text: ``looplab.text.model_dir_analyses``).

One traced forward (attention on, stored on CPU in float32) of ``samples``
instances at the longest training length, run for ``loops`` loops, feeds every
metric: convergence, distinct fixed points, attention differences and the
Lipschitz bound, ColSum concentration (per loop and over effective depth),
token dynamics of h_t over the last loops, massive activations, and the
MLP-zeroing ablation of each core layer (one more trace per layer).

Each metric is an entry of the registry in ``registry.py`` (the contract is
there); this module registers the built-in ones, in the order their summary
entries appear. Files: summary.json, convergence.csv, fixed_points.csv,
layer_cosines.csv, colsum.csv, attention.csv, massive.csv and convergence.png,
cosine_matrix.png, attention_difference.png, colsum_depth.png.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor

from looplab.analysis.attention import attention_difference, consecutive_attention_difference, lipschitz_check
from looplab.analysis.colsum import colsum_depth, colsum_trace
from looplab.analysis.dynamics import token_dynamics
from looplab.analysis.fixed_points import (
    convergence,
    fixed_point_cross_cos_min,
    late_self_cos,
    layer_cosines,
    self_convergence,
    state_norms,
    update_ratios,
)
from looplab.analysis.massive import massive_activations, zero_mlp
from looplab.analysis.plots import (
    ATTENTION_PANELS,
    plot_attention_difference,
    plot_colsum_depth,
    plot_convergence,
    plot_cosine_matrix,
)
from looplab.analysis.registry import AnalysisInput, AnalysisOptions, MetricResult, register_metric, run_metrics
from looplab.analysis.text import start_line
from looplab.config import Config
from looplab.experiment import Experiment, training_depth
from looplab.memory import check_fits, trace_bytes
from looplab.model.protocol import LoopedModel
from looplab.model.trace import Trace, trace
from looplab.params import fill
from looplab.seeding import derive_generator

__all__ = ["analyze_mechanistic", "analyze_config", "analyze_experiment", "analyze_model", "analysis_trace"]


def _finite(value: float) -> float | None:
    """JSON-safe float: NaN/inf (e.g. cross-layer cosine of a one-layer core) become null."""
    return float(value) if math.isfinite(value) else None


def analyze_mechanistic(run_dir: str | Path, out: str | Path | None = None, **options) -> dict:
    """Analyse ``run_dir``'s latest checkpoint; returns the summary (also in summary.json).

    ``out`` defaults to ``RUN_DIR/analysis/mechanistic``; ``options`` as for :func:`analyze_experiment`.
    """
    exp = Experiment.from_run(run_dir)
    out = Path(out) if out else Path(run_dir) / "analysis" / "mechanistic"
    return analyze_experiment(exp, out, label=Path(run_dir).name, **options)


def analyze_config(config: Config, out: str | Path, **options) -> dict:
    """Analyse the untrained model ``config`` initialises (seed ``run.seed``); returns the summary."""
    exp = Experiment.build(config)
    exp.model.eval()
    return analyze_experiment(exp, Path(out), label=Path(out).name, **options)


@torch.no_grad()
def analyze_experiment(exp: Experiment, out: Path, *, label: str = "", progress: bool = False, **options) -> dict:
    """Trace ``exp.model`` and write every registered metric's entries, tables and plots.

    Args:
        label: the name plot titles start with.
        progress: show which metric is being computed (a bar on a terminal, lines elsewhere).
        options: the fields of :class:`AnalysisOptions` (``loops``, ``samples``, ``window``, ``tol``,
            ``max_period``, ``mlp_ablation``, ``metrics``, ``plots``, ``zero_mlp``), each checked against
            its domain; the rest keep their defaults.
    """
    settings = fill(AnalysisOptions, options, "analysis")
    check_fits(  # the trace is held whole (every loop, every core layer) before any metric is written
        f"an analysis trace of {settings.samples} samples x {settings.loops} loops",
        trace_bytes(exp.config, exp.task, settings.samples, settings.loops, settings.needs_attention),
        "cpu",
        "use fewer --loops or --samples",
    )
    seed, length = exp.config.run.seed, exp.config.task.train_max
    batch = exp.task.sample(length, settings.samples, derive_generator(seed, "mechanistic", length))
    header = {
        "checkpoint": exp.checkpoint,
        "steps_trained": int(exp.checkpoint.split("_")[1]) if exp.checkpoint else 0,
        "loops": settings.loops,
        "samples": settings.samples,
        "length": length,
    }
    if progress:
        line = start_line("mechanistic", label or "model", exp.checkpoint, settings.samples, length, settings.loops)
        print(line, flush=True)
    return analyze_model(
        exp.model,
        batch.tokens,
        batch.valid,
        out,
        settings,
        header,
        label=label,
        training_depth=training_depth(exp.config),
        init_seed=seed,
        exp=exp,
        progress=progress,
    )


@torch.no_grad()
def analyze_model(
    model: LoopedModel,
    tokens: Tensor,
    valid: Tensor,
    out: Path,
    settings: AnalysisOptions,
    header: dict,
    *,
    label: str = "",
    training_depth: int | None = None,
    init_seed: int | None = None,
    exp: Experiment | None = None,
    progress: bool = False,
) -> dict:
    """The mechanistic analysis of any model of the looped-model protocol on tokens / valid [B, T]: one
    trace of ``settings.loops`` loops (stored on CPU in float32), every selected metric, their files in
    ``out`` and summary.json (``header`` first). The caller has checked that the trace fits.

    Args:
        training_depth: the depth the plots mark, or None.
        init_seed: the seed of a noise initial state (``derive_generator(seed, "mechanistic", "init")``).
        exp: the experiment, when a looplab run is analysed (metrics may read it).
    """

    def retrace() -> Trace:
        generator = None if init_seed is None else derive_generator(init_seed, "mechanistic", "init")
        return trace(
            model,
            tokens,
            valid,
            settings.loops,
            attention=settings.needs_attention,
            dtype=torch.float32,
            device="cpu",
            generator=generator,
        )

    header = {**header, **({"zero_mlp": settings.zero_mlp} if settings.zero_mlp else {})}
    with zero_mlp(model, settings.zero_mlp) if settings.zero_mlp else nullcontext():
        inputs = AnalysisInput(exp, retrace(), label, retrace, settings, model, training_depth)
        return run_metrics(inputs, out, header, progress)


def analysis_trace(exp: Experiment, loops: int, samples: int, attention: bool) -> Trace:
    """The trace an analysis reads: ``samples`` instances at the longest training length, drawn from the
    run's seed (as is a noise initial state), ``loops`` loops, stored on CPU in float32."""
    seed, length = exp.config.run.seed, exp.config.task.train_max
    batch = exp.task.sample(length, samples, derive_generator(seed, "mechanistic", length))
    return trace(
        exp.model,
        batch.tokens,
        batch.valid,
        loops,
        attention=attention,
        dtype=torch.float32,
        device="cpu",
        generator=derive_generator(seed, "mechanistic", "init"),
    )


@register_metric("fixed_points", attention=False)
def fixed_point_metric(inputs: AnalysisInput) -> MetricResult:
    """Cosine of each state to its own final state, between layers' fixed points, state norms, update ratios."""
    states, valid, loops = inputs.states, inputs.valid, inputs.loops
    n_layers = states.shape[1]
    cosines = layer_cosines(states, valid)  # [k, k]
    self_curves = self_convergence(states, valid, per_sample=True)  # [k, r, B]
    self_cos = self_curves.mean(-1)  # [k, r]
    self_first, self_first_median = late_self_cos(self_curves[0])
    norms = state_norms(inputs.loop_states, valid)  # [r]
    ratios = update_ratios(states, valid)  # [k − 1]
    return MetricResult(
        summary={
            "fixed_point_self_cos": _finite(self_first),
            "fixed_point_self_cos_median": _finite(self_first_median),
            "fixed_point_cross_cos_min": _finite(fixed_point_cross_cos_min(states, valid)),
            "state_norm_first": float(norms[0]),
            "state_norm_last": float(norms[-1]),
            "update_ratio_mean": float(ratios.mean()) if ratios.numel() else None,
            "update_ratio_last": ratios.tolist(),
        },
        tables={
            "fixed_points.csv": (
                ["layer", "loop", "cos_to_own_final_state"],
                [(layer, t, float(self_cos[layer, t - 1])) for layer in range(n_layers) for t in range(1, loops + 1)],
            ),
            "layer_cosines.csv": (
                ["layer", *[f"layer{j}" for j in range(n_layers)]],
                [[i, *(float(v) for v in cosines[i])] for i in range(n_layers)],
            ),
        },
        plots={
            "cosine_matrix.png": lambda path: plot_cosine_matrix(
                cosines, path, f"{inputs.label}: cos between layers, loop {loops}"
            )
        },
    )


@register_metric("convergence", attention=False)
def convergence_metric(inputs: AnalysisInput) -> MetricResult:
    """Δ_(ℓ,t) = ‖X_t − X_{t−1}‖ / ‖X_t‖ per core layer and loop."""
    delta = convergence(inputs.states, inputs.valid)  # [k, r−1]
    rows = [
        (layer, t, float(delta[layer, t - 2])) for layer in range(delta.shape[0]) for t in range(2, inputs.loops + 1)
    ]
    return MetricResult(
        summary={"convergence_last": [float(v) for v in delta[:, -1]] if inputs.loops >= 2 else []},
        tables={"convergence.csv": (["layer", "loop", "delta"], rows)},
        plots={
            "convergence.png": lambda path: plot_convergence(
                delta, path, rf"{inputs.label}: convergence $\Delta_{{\ell,t}}$", inputs.training_depth
            )
        },
    )


@register_metric("attention")
def attention_metric(inputs: AnalysisInput) -> MetricResult:
    """‖A_t − A_t′‖_F between loops, its consecutive-loop curve and the Lipschitz bound."""
    attn, loops = inputs.attention, inputs.loops
    diff = attention_difference(attn[:, :ATTENTION_PANELS])  # [min(k, panels), r, r], for the heatmaps
    step_diff = consecutive_attention_difference(attn)  # [k, r−1]
    bound = lipschitz_check(inputs.model, inputs.recorded)  # None: the attention is not of the bound's form
    rows = [
        (
            layer,
            t,
            float(step_diff[layer, t - 2]),
            None if bound is None else float(bound.ratio[layer, t - 2].max()),
            None if bound is None else bool(bound.holds[layer, t - 2].all()),
        )
        for layer in range(step_diff.shape[0])
        for t in range(2, loops + 1)
    ]
    lipschitz = {"holds_fraction": None, "ratio_max": None, "kappa": None}
    if bound is not None:
        lipschitz = {
            "holds_fraction": float(bound.holds.double().mean()) if bound.holds.numel() else None,
            "ratio_max": float(bound.ratio.max()) if bound.ratio.numel() else None,
            "kappa": bound.kappa.tolist(),
        }
    return MetricResult(
        summary={
            # one loop has no pair of loops to compare: undefined (None), not 0 or "holds"
            "attention_diff_last": float(step_diff[:, -1].mean()) if loops >= 2 else None,
            "lipschitz": lipschitz,
        },
        tables={"attention.csv": (["layer", "loop", "attn_diff_prev", "lipschitz_ratio_max", "bound_holds"], rows)},
        plots={
            "attention_difference.png": lambda path: plot_attention_difference(
                diff,
                path,
                rf"{inputs.label}: $\|A_{{\ell,t}} - A_{{\ell,t'}}\|_F$",
                training_depth=inputs.training_depth,
            )
        },
    )


@register_metric("colsum")
def colsum_metric(inputs: AnalysisInput) -> MetricResult:
    """ColSum concentration per loop and over effective depth, and (optionally) with each core MLP zeroed."""
    colsum, model = inputs.colsum, inputs.model
    depth_values, depth_labels = colsum_depth(inputs.recorded, colsum)
    ablation = []
    for layer in range(len(model.core) if inputs.options.mlp_ablation else 0):
        with zero_mlp(model, layer):
            ablated = colsum_trace(inputs.retrace())
        ablation.append(
            {"layer": layer, "colsum_mean": float(colsum.mean()), "colsum_mean_ablated": float(ablated.mean())}
        )
    rows = [
        (i, name, head, float(depth_values[i, head]))
        for i, name in enumerate(depth_labels)
        for head in range(depth_values.shape[1])
    ]
    return MetricResult(
        summary={
            "colsum": {
                "mean": float(colsum.mean()),
                "last_loop_per_layer": colsum[-1].mean(-1).tolist(),
                "mlp_ablation": ablation,
            }
        },
        tables={"colsum.csv": (["depth", "name", "head", "colsum"], rows)},
        plots={
            "colsum_depth.png": lambda path: plot_colsum_depth(
                depth_values, depth_labels, path, f"{inputs.label}: ColSum over effective depth"
            )
        },
    )


@register_metric("token_dynamics", attention=False)
def token_dynamics_metric(inputs: AnalysisInput) -> MetricResult:
    """Each token's h_t over the last loops: fixed point, periodic orbit or slider."""
    loops, options = inputs.loops, inputs.options
    window, tol = options.dynamics_window, options.tol
    if loops < 2:
        return MetricResult({"token_dynamics": None})
    dynamics = token_dynamics(
        inputs.loop_states[:, inputs.valid], window=window, tol=tol, max_period=options.max_period
    )
    return MetricResult(
        {"token_dynamics": {**dynamics.fractions, "tokens": int(dynamics.labels.numel()), "window": window, "tol": tol}}
    )


@register_metric("massive", attention=False)
def massive_metric(inputs: AnalysisInput) -> MetricResult:
    """Massive activations: the largest |activation| over the median, per loop and layer."""
    massive = massive_activations(inputs.states, inputs.valid)  # [r, k]
    rows = [
        (t, layer, float(massive[t - 1, layer]))
        for t in range(1, inputs.loops + 1)
        for layer in range(massive.shape[1])
    ]
    return MetricResult(
        summary={"massive_ratio_max": float(massive.max()), "massive_ratio_last_loop": massive[-1].tolist()},
        tables={"massive.csv": (["loop", "layer", "max_over_median"], rows)},
    )
