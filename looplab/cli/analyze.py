"""``looplab analyze``: the mechanistic, spectral and PCA analyses of a run (or of a config's initialisation)."""

from __future__ import annotations

from pathlib import Path

from looplab.cli.parser import ANALYSIS
from looplab.config import resolve_preset
from looplab.errors import LooplabError


def analyze_command(args) -> None:
    """``looplab analyze [KIND] RUN_DIR``: one analysis, written under the run (or ``--out``); on a model dir
    (config.json) with ``--text``, the analysis of the text's windows (``looplab.cli.models``)."""
    from looplab.cli.models import analyze_model_dir, takes_model_dir

    out = Path(args.out) if args.out else Path(args.run_dir) / "analysis"
    if args.out:
        check_analysis_out(Path(args.out))
    if takes_model_dir(args):
        return analyze_model_dir(args, args.kind)
    if args.kind == "mechanistic" and args.loops is None:
        args.loops = ANALYSIS.loops
    if args.kind in ("mechanistic", "spectral") and args.samples is None:
        args.samples = ANALYSIS.samples if args.kind == "mechanistic" else 4
    KIND_COMMANDS[args.kind](args, out)


def _mechanistic(args, out: Path) -> None:
    from looplab.analysis.mechanistic import analyze_config, analyze_mechanistic
    from looplab.analysis.text import format_mechanistic
    from looplab.experiment import load_checked_config

    if min(args.loops, args.samples) < 1:
        raise LooplabError("--loops and --samples must be >= 1")
    options = {
        "loops": args.loops,
        "samples": args.samples,
        "mlp_ablation": not args.no_mlp_ablation,
        "zero_mlp": args.zero_mlp,
        "metrics": args.metrics,
        "plots": not args.no_plots,
        "progress": True,
    }
    if resolve_preset(args.run_dir).is_file():
        if not args.out:
            raise LooplabError(f"analysing the initialisation of config {args.run_dir} needs --out DIR")
        summary = analyze_config(load_checked_config(args.run_dir, args.set), args.out, **options)
    else:
        if args.set:
            raise LooplabError("--set applies to a config file; a run dir's config is fixed")
        summary = analyze_mechanistic(args.run_dir, out=args.out, **options)
    print(format_mechanistic(summary))
    written = "summary.json, CSVs and plots" if not args.no_plots else "summary.json and CSVs"
    print(f"wrote {args.out or out / 'mechanistic'}: {written}")


def _spectral(args, out: Path) -> None:
    from looplab.analysis.run import analyze_spectral, format_spectral
    from looplab.cli.models import exact_loops

    if args.iters < 1:
        raise LooplabError(f"--iters must be >= 1, got {args.iters}")
    summary = analyze_spectral(
        args.run_dir,
        args.length,
        args.loops,
        args.samples,
        args.iters,
        args.out,
        exact_loops(args.exact_at, args.loops, args.run_dir),
        progress=True,
    )
    print(format_spectral(summary))
    print(f"wrote {out}/spectral.csv, spectral.json, spectral.png")


def _pca(args, out: Path) -> None:
    from looplab.analysis.run import analyze_pca

    if args.sample < 0:
        raise LooplabError(f"--sample must be >= 0 (the index of the traced sample), got {args.sample}")
    summary = analyze_pca(args.run_dir, args.length, args.loops, args.sample, args.out, progress=True)
    print(f"explained variance: {', '.join(f'{100 * v:.1f}%' for v in summary['explained_variance'])}")
    print(f"wrote {out}/pca_2d.png, pca_3d.png")


#: ``looplab analyze KIND``: each kind's command
KIND_COMMANDS = {"mechanistic": _mechanistic, "spectral": _spectral, "pca": _pca}


def check_analysis_out(out: Path) -> None:
    """Refuse an analysis ``--out`` whose files it would overwrite: an evaluation, a run or a sweep dir."""
    from looplab.rundir import CONFIG_FILE, SWEEP_FILE, is_sweep_dir

    if is_sweep_dir(out):
        raise LooplabError(f"--out {out} is a sweep dir (it holds {SWEEP_FILE}); write the analysis elsewhere")
    for marker, kind in (
        ("grid.parquet", "an evaluation"),
        ("lm_summary.json", "an evaluation"),
        (CONFIG_FILE, "a run"),
        ("config.json", "a model"),
    ):
        if (out / marker).is_file():
            raise LooplabError(f"--out {out} is {kind} dir (it holds {marker}); write the analysis elsewhere")
