"""The analyses of looplab's tools on a model directory, run on a user's text with the model's own tokenizer
(the windows, checks and estimates of :mod:`looplab.text.model_dirs`):

    analyze_text_mechanistic   the mechanistic analysis (``looplab.analysis.mechanistic.analyze_model``)
    analyze_text_spectral      ρ of the loop Jacobian per loop (``looplab.analysis.run.write_spectral``)
    analyze_text_pca           the PCA of one window's loop states h_1..h_K (``looplab.analysis.pca``)

Every argument, the model dir, the tokenizer, the text and the memory estimate are checked before the
weights are read, and all of it before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import torch

from looplab.errors import LooplabError
from looplab.lm.families import LOOPED_FAMILIES
from looplab.lm.model_dir import ModelDir
from looplab.stability.spectral import default_exact_loops, power_products
from looplab.text.compute import JVP_PASSES
from looplab.text.model_dirs import (
    ANALYSIS_WINDOW,
    SPECTRAL_LOOPS_FACTOR,
    activation_bytes,
    check_out,
    prepare,
    run_header,
    time_estimate,
    windows_phrase,
)

__all__ = ["analyze_text_mechanistic", "analyze_text_spectral", "analyze_text_pca"]


def analyze_text_mechanistic(
    path,
    text,
    out=None,
    window: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer=None,
    progress: bool = False,
    **options,
) -> dict:
    """The mechanistic analysis on ``samples`` windows of ``text`` (default loops 4 × native): summary.json,
    CSVs and plots in ``out`` (default DIR/analysis/mechanistic); ``options`` as for
    :class:`looplab.analysis.registry.AnalysisOptions`. Returns the summary."""
    from looplab.analysis.mechanistic import analyze_model
    from looplab.analysis.registry import AnalysisOptions
    from looplab.memory import recorded_trace_bytes
    from looplab.params import fill

    loops = options.pop("loops", None)
    samples = options.pop("samples", None)
    ablation = options.get("mlp_ablation", AnalysisOptions().mlp_ablation)

    def passes(opened: ModelDir, k: int) -> float:  # one trace, and one more per core layer with its MLP zeroed
        return k * (1 + (_core_layers(opened) if ablation else 0))

    model_dir, windows, loops, torch_dtype = prepare(
        path, tokenizer, text, window, ANALYSIS_WINDOW, samples, loops, "--loops", dtype, device, passes,
        AnalysisOptions().samples,
    )  # fmt: skip
    settings = fill(AnalysisOptions, {**options, "loops": loops, "samples": len(windows)}, "analysis")
    out = Path(out) if out is not None else model_dir.path / "analysis" / "mechanistic"
    check_out(out)
    length = windows.shape[1]
    layers = _core_layers(model_dir)
    traced = recorded_trace_bytes(
        len(windows),
        length,
        loops,
        layers,
        model_dir.width,
        model_dir.heads,
        _state_width(model_dir),
        settings.needs_attention,
    )
    extra = traced + activation_bytes(model_dir, len(windows), length, torch_dtype)
    model_dir.check_fits(torch_dtype, device, f"an analysis trace of {len(windows)} windows x {loops} loops", extra)
    if progress:
        print(
            f"analyze mechanistic: {model_dir.path} ({model_dir.name}): {windows_phrase(len(windows))} of {length} "
            f"tokens of {text}, loops 1..{loops}: "
            + time_estimate(model_dir, len(windows) * passes(model_dir, loops), length, torch_dtype, device),
            flush=True,
        )
    model = model_dir.load(torch_dtype, device)
    if settings.zero_mlp:  # checked before anything is written
        from looplab.analysis.massive import mlp_modules
        from looplab.errors import choice_error

        if settings.zero_mlp not in mlp_modules(model):
            raise choice_error("MLP to zero", settings.zero_mlp, mlp_modules(model))
    header = run_header(model_dir, text, windows, loops, dtype)
    valid = torch.ones_like(windows, dtype=torch.bool)
    return analyze_model(
        model,
        windows,
        valid,
        out,
        settings,
        header,
        label=model_dir.path.name,
        training_depth=model_dir.native_loops,
        progress=progress,
    )


def _core_layers(model_dir: ModelDir) -> int:
    """The layers a trace records per loop: the looped core's (its family's record says how many)."""
    if model_dir.split is not None:
        return model_dir.split.core
    return LOOPED_FAMILIES[model_dir.model_type].core_layers(model_dir.config)


def _state_width(model_dir: ModelDir) -> int:
    """An upper bound of the loop state's width per token: d for a retrofit, its family's record's otherwise."""
    if model_dir.split is not None:
        return model_dir.width
    return LOOPED_FAMILIES[model_dir.model_type].state_width(model_dir.config)


@torch.no_grad()
def _state_width_of(model, batch) -> int:
    """The width per token of the loop state after a loop (h_1), on the first window."""
    h, e, ctx = model.start(batch.tokens[:1], batch.valid[:1])
    return model.step(h, e, ctx).shape[-1]


def analyze_text_spectral(
    path,
    text,
    loops: int | None = None,
    samples: int | None = None,
    iters: int = 10,
    out=None,
    exact_loops=None,
    window: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer=None,
    progress: bool = False,
) -> dict:
    """ρ of the loop Jacobian per loop (default loops 2 × native) on ``samples`` windows of ``text`` (default
    4, fewer for a large model: :mod:`looplab.text.compute`): spectral.csv, spectral.png and spectral.json in
    ``out`` (default DIR/analysis); returns the summary. ``exact_loops``: loops, ``"all"``, or None (the
    first, middle and last where the exact spectrum is cheap: its L·d Jacobian columns a window cost no
    more than the power iteration's products). The power iteration starts from a direction drawn with seed 0."""
    from looplab.analysis.run import checked_exact_loops, write_spectral
    from looplab.seeding import derive_generator
    from looplab.tasks import TaskBatch

    if iters < 1:
        raise LooplabError(f"--iters must be >= 1, got {iters}")

    def passes(_, k: int) -> float:  # the trajectory, then the warm-started power iteration's products
        return k + JVP_PASSES * power_products(k, iters)

    model_dir, windows, loops, torch_dtype = prepare(
        path,
        tokenizer,
        text,
        window,
        ANALYSIS_WINDOW,
        samples,
        loops,
        "--loops",
        dtype,
        device,
        passes,
        4,
        SPECTRAL_LOOPS_FACTOR,
    )
    out = Path(out) if out is not None else model_dir.path / "analysis"
    check_out(out)
    length, width = windows.shape[1], _state_width(model_dir)
    if exact_loops is None:  # by default only where it is cheap beside the power iteration
        cheap = length * width <= power_products(loops, iters)
        exact_loops = list(default_exact_loops(loops)) if cheap else []
    elif exact_loops == "all":
        exact_loops = range(1, loops + 1)
    exact_loops = sorted(set(exact_loops))
    # one loop's forward and tangent for the windows (the exact spectrum's L·d tangents of one window at
    # once), and a table row per window and loop
    tangents = max(len(windows), length * width if exact_loops else 0)
    work = 2 * activation_bytes(model_dir, tangents, length, torch_dtype) + 512 * len(windows) * loops
    model_dir.check_fits(torch_dtype, device, f"a spectral analysis of {len(windows)} windows x {loops} loops", work)
    count = len(windows) * (passes(None, loops) + JVP_PASSES * length * width * len(exact_loops))
    if progress:
        print(
            f"analyze spectral: {model_dir.path} ({model_dir.name}): {windows_phrase(len(windows))} of {length} "
            f"tokens of {text}, loops 1..{loops}, {iters} power iterations a loop"
            f"{f', exact at {len(exact_loops)} loops' if exact_loops else ''}: "
            + time_estimate(model_dir, count, length, torch_dtype, device),
            flush=True,
        )
    model = model_dir.load(torch_dtype, device, eager_experts=True)
    valid = torch.ones_like(windows, dtype=torch.bool)
    batch = TaskBatch(windows, windows, valid, torch.full((len(windows),), length)).to(device)
    exact = checked_exact_loops(exact_loops, loops, length, _state_width_of(model, batch))
    title = f"{model_dir.path.name}: loop Jacobian, {length}-token windows"
    generator = derive_generator(0, "spectral")
    return write_spectral(model, batch, loops, iters, exact, generator, out, title, model_dir.native_loops, progress)


@torch.no_grad()
def analyze_text_pca(
    path,
    text,
    loops: int | None = None,
    sample: int = 0,
    out=None,
    window: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer=None,
) -> dict:
    """PCA of window ``sample``'s loop states h_1..h_K [K, T, state width] (default K 4 × native; the whole
    loop state, e.g. [z_H | z_L] for HRM-Text): pca_2d.png and pca_3d.png in ``out`` (default DIR/analysis).
    Returns the explained-variance ratios of the top three components."""
    from looplab.analysis.pca import plot_trajectories, trajectory_pca

    if sample < 0:
        raise LooplabError(f"--sample must be >= 0 (the index of the traced window), got {sample}")
    model_dir, windows, loops, torch_dtype = prepare(
        path, tokenizer, text, window, ANALYSIS_WINDOW, sample + 1, loops, "--loops", dtype, device
    )
    if sample >= len(windows):
        raise LooplabError(
            f"--sample {sample}: {text} holds only {len(windows)} window(s) of {windows.shape[1]} tokens"
        )
    out = Path(out) if out is not None else model_dir.path / "analysis"
    check_out(out)
    length = windows.shape[1]
    work = activation_bytes(model_dir, 1, length, torch_dtype) + loops * length * _state_width(model_dir) * 4
    model_dir.check_fits(torch_dtype, device, f"a PCA of one window x {loops} loops", work)
    model = model_dir.load(torch_dtype, device)
    row = windows[sample : sample + 1].to(device)
    states = torch.stack([h[0].float().cpu() for h in model.unroll(row, torch.ones_like(row), loops)])
    coords, explained = trajectory_pca(states)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{model_dir.path.name}: window {sample} ({length} tokens), loops 1..{loops}"
    plot_trajectories(coords, explained, out / "pca_2d.png", out / "pca_3d.png", title)
    return {"explained_variance": [float(v) for v in explained], "loops": loops, "tokens": length}
