"""Command line: ``looplab train | eval | config show | analyze | sweep | report | reproduce | results | demo``.

User mistakes end in one line on stderr and exit code 2 (no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from looplab import __version__
from looplab.analysis.registry import AnalysisOptions
from looplab.config import DEFAULT_SAMPLES, PRESETS, load_config, resolve_preset
from looplab.errors import LooplabError, choice_error
from looplab.generation import EXITS, POLICIES
from looplab.report.paper import PAPERS
from looplab.train.stop import Stopped

ANALYSES = ("mechanistic", "spectral", "pca")
ANALYSIS = AnalysisOptions()  # the mechanistic analysis's defaults
#: the reproduction sweeps: configs/sweeps/<paper>-<scale>.toml, each named after a registered paper
STUDIES = tuple(sorted(path.stem for path in (PRESETS / "sweeps").glob("*.toml")))
#: studies with a part that is not a sweep of configs: its settings file, run after the sweep
STUDY_EXTRAS = {"stars-lm": "stars-lm/retrofit.toml"}


def _lengths(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 8,12,16, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


#: what ``--help`` shows under each command (``runs/demo`` is what ``make demo`` writes, ``runs/lm`` a text run)
EXAMPLES = {
    "train": [
        "looplab train demo --out runs/demo",
        "looplab train stopping-small/dyck1-window --set run.seed=3 --set train.steps=300 --out runs/w3",
        "looplab train puzzles/sudoku4-matched --set 'run.plugins=[\"looplab.examples.plugins.scaled\"]' "
        "--set schedule.name=scaled --set schedule.cap=16 --out runs/s4",
    ],
    "eval": [
        "looplab eval runs/demo",
        "looplab eval runs/demo --lengths 8,16,32 --max-loops 64 --scaling",
        "looplab eval runs/lm --lm-loops 32   (a kjv or kjv_arithmetic run)",
    ],
    "show": ["looplab config show demo", "looplab config show demo --set schedule.name=rl_halting"],
    "mechanistic": [
        "looplab analyze runs/demo",
        "looplab analyze mechanistic runs/demo --loops 64 --samples 4 --no-mlp-ablation",
        "looplab analyze mechanistic runs/demo --zero-mlp core0 --out runs/demo/analysis/zero-core0",
        "looplab analyze mechanistic mechanistic/ablation-pre-injection --out runs/init   (an untrained model)",
    ],
    "spectral": ["looplab analyze spectral runs/demo --loops 64 --exact-at all"],
    "pca": ["looplab analyze pca runs/demo --loops 64 --sample 3"],
    "sweep": [
        "looplab sweep sweeps/stars-small --out runs/stars --workers 2",
        "looplab sweep my_sweep.toml --out runs/mine --workers 2 --backend ray --address auto",
    ],
    "report": ["looplab report runs/stars --paper stars"],
    "reproduce": ["looplab reproduce stopping-small --out runs/stopping --workers 2"],
    "results": ["looplab results --check"],
    "demo": ["looplab demo", "looplab demo --out runs/demo2"],
    "pool": ["looplab pool sudoku9 --sizes 40,45,50,55 --count 2000 --workers 2 --out pools/sudoku9.safetensors"],
    "generate": [
        "looplab generate runs/lm --prompt 'k=7;q=k+1;q?' --stop '\\n' --exit convergence --loops 16",
        "looplab generate runs/lm --prompts-file prompts.txt --temperature 0.8 --top-k 20 --seed 1",
    ],
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage stays behind ``--help``); subcommands inherit it,
    with their :data:`EXAMPLES` under ``--help``."""

    def __init__(self, *args, **kwargs):
        name = kwargs.get("prog", "").split()[-1] if kwargs.get("prog") else ""
        if name in EXAMPLES and "epilog" not in kwargs:
            kwargs["epilog"] = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
            kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"looplab: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="looplab", description="Looped transformers: train, evaluate, analyse.")
    parser.add_argument("--version", action="version", version=f"looplab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model from a TOML config")
    train.add_argument("config", help="config TOML file")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a key")
    train.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    evaluate = commands.add_parser("eval", help="evaluate a run on the length x loops grid")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--lengths", type=_lengths, help="comma-separated instance sizes, e.g. 8,12,16")
    evaluate.add_argument("--max-loops", type=int, help="unroll depth T_eval")
    evaluate.add_argument("--samples", type=int, help="samples per length")
    evaluate.add_argument(
        "--scaling", action="store_true", help="also write the test-time scaling curve (eval/scaling.csv, scaling.png)"
    )
    evaluate.add_argument(
        "--lm-loops",
        type=int,
        metavar="T",
        help="text (kjv, kjv_arithmetic) runs: validation loss (and reasoning) against loops 1..T (eval/lm_loops.csv)",
    )

    config = commands.add_parser("config", help="inspect configs")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config")
    show.add_argument("config")
    show.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")

    analyze = commands.add_parser("analyze", help="analyse a trained run (results under RUN_DIR/analysis)")
    kinds = analyze.add_subparsers(dest="kind", required=True)
    mechanistic = kinds.add_parser(
        "mechanistic",
        help="fixed points, attention across loops, ColSum stages (the default: `looplab analyze RUN_DIR`)",
    )
    spectral = kinds.add_parser("spectral", help="spectral radius of the loop Jacobian along the trajectory")
    pca = kinds.add_parser("pca", help="2-D / 3-D PCA of one sample's latent trajectory")
    mechanistic.add_argument("run_dir", help="a run dir, or a config TOML to analyse its untrained initialisation")
    mechanistic.add_argument(
        "--loops", type=int, default=ANALYSIS.loops, help=f"unroll depth (default {ANALYSIS.loops})"
    )
    mechanistic.add_argument("--samples", type=int, default=ANALYSIS.samples)
    mechanistic.add_argument(
        "--out", help="output folder (default RUN_DIR/analysis/mechanistic; required for a config)"
    )
    mechanistic.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a key of a config (not of a run dir)",
    )
    mechanistic.add_argument(
        "--no-mlp-ablation", action="store_true", help="skip the re-traces with each core layer's MLP zeroed"
    )
    mechanistic.add_argument(
        "--zero-mlp",
        metavar="LAYER",
        default="",
        help="zero this MLP's output throughout (preludeI, coreI or codaI), e.g. to remove a massive activation",
    )
    mechanistic.add_argument(
        "--metrics", type=_names, default=[], help="comma-separated metrics to compute (default: all)"
    )
    mechanistic.add_argument("--no-plots", action="store_true", help="write summary and CSVs only")
    for sub in (spectral, pca):
        sub.add_argument("run_dir")
        sub.add_argument("--length", type=int, help="instance size (default: the longest training length)")
        sub.add_argument("--loops", type=int, help="unroll depth (default: eval.max_loops)")
        sub.add_argument("--out", help="output folder (default RUN_DIR/analysis)")
    spectral.add_argument("--samples", type=int, default=4, help="instances measured (default 4)")
    spectral.add_argument(
        "--iters", type=int, default=10, help="power iterations per loop, warm-started (4x at loop 1; default 10)"
    )
    spectral.add_argument(
        "--exact-at",
        metavar="LOOPS",
        help="loops where the exact eigenvalues are computed too: comma-separated, `all` or `none` "
        "(default: first, middle and last, when L·d <= 4096)",
    )
    pca.add_argument("--sample", type=int, default=0, help="which sample to trace")

    sweep = commands.add_parser("sweep", help="train and evaluate a grid of configs x overrides x seeds")
    sweep.add_argument("sweep_file", help="sweep TOML file")
    report = commands.add_parser("report", help="tables, plots and report.html from a sweep dir")
    report.add_argument("sweep_dir")
    report.add_argument("--paper", choices=list(PAPERS), help="put this paper's numbers side by side")
    reproduce = commands.add_parser(
        "reproduce", help="run a paper's study at CPU (-small) or paper (-paper) scale, then its report"
    )
    reproduce.add_argument("study", choices=STUDIES)
    for sub in (sweep, reproduce):
        sub.add_argument("--out", required=True, help="sweep dir (resumed if it exists)")
        sub.add_argument("--workers", type=int, default=1, help="local worker processes, one torch thread each")
        sub.add_argument("--backend", choices=("local", "ray"), default="local")
        sub.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
        sub.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    results = commands.add_parser(
        "results", help="regenerate the committed results pages (docs/results/*.md) from their committed CSVs"
    )
    results.add_argument("--dir", default="docs/results", help="the pages' folder (default docs/results)")
    results.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is out of date")
    results.add_argument(
        "--collect",
        nargs="+",
        metavar="SWEEP_DIR",
        help="first rebuild a study's per-seed CSVs from these sweep dirs (the study: --study)",
    )
    results.add_argument(
        "--study",
        default="stopping-confirm",
        help="whose CSVs --collect rebuilds: stopping-confirm (default), recursive-small, recursive-confirm, …",
    )

    generate = commands.add_parser(
        "generate",
        help="continue text prompts with a trained byte-level LM run (kjv, kjv_arithmetic, kjv_trace), depth per token",
    )
    generate.add_argument("run_dir", help="a trained run of a text task")
    generate.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    generate.add_argument("--prompts-file", help="a UTF-8 file of prompts, one per line")
    generate.add_argument("--max-new-tokens", type=int, default=64, help="tokens to add per prompt (default 64)")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 (the default) decodes greedily")
    generate.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0: all)")
    generate.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    generate.add_argument(
        "--exit", choices=list(EXITS), default="fixed", help="how deep each new token runs (default: fixed)"
    )
    generate.add_argument(
        "--loops", type=int, help="the fixed depth, or the cap of an adaptive exit (default: eval.fixed_exit)"
    )
    generate.add_argument("--eps", type=float, default=1e-3, help="threshold of the convergence and kl exits")
    generate.add_argument("--threshold", type=float, default=0.9, help="max-probability of the confidence exit")
    generate.add_argument(
        "--cache", choices=(*POLICIES, "none"), default="per_loop", help="KV cache across loops (default per_loop)"
    )
    generate.add_argument(
        "--keep-loops", type=int, default=2, help="loops kept per token by the last_m cache (default 2)"
    )
    generate.add_argument("--stop", action="append", default=[], help="stop a row at this text (\\n for a newline)")
    generate.add_argument("--show-depths", action="store_true", help="print the loops of every new token")

    pool = commands.add_parser(
        "pool", help="draw training instances that are slow to draw (9x9 Sudoku, large mazes) once, for task.pool"
    )
    pool.add_argument("task", help="a registered task, e.g. sudoku9 or maze")
    pool.add_argument("--sizes", type=_lengths, required=True, help="comma-separated instance sizes, e.g. 40,45,50")
    pool.add_argument("--count", type=int, required=True, help="instances per size")
    pool.add_argument("--seed", type=int, default=0, help="the pool's own seed (default 0)")
    pool.add_argument("--alphabet", type=int, default=8, help="the task's alphabet (default 8)")
    pool.add_argument("--workers", type=int, default=1, help="processes drawing in parallel (default 1)")
    pool.add_argument("--out", required=True, help="the pool file to write (safetensors)")

    demo = commands.add_parser("demo", help="train and evaluate a small binary-addition model (minutes on a CPU)")
    demo.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    return parser


def _train(args) -> None:
    from looplab.train.trainer import train

    config = load_config(args.config, args.set)
    train(config, Path(args.out), progress=not args.no_progress)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one line for the run, not one per rank
        print(f"trained: {args.out}")
        print(f"next: looplab eval {args.out}   (then: tensorboard --logdir {Path(args.out) / 'tensorboard'})")


def _eval(args) -> None:
    from looplab.eval.run import evaluate_run, format_summary

    if args.lm_loops is not None:
        from looplab.lm.evaluate import evaluate_lm_run

        if args.lm_loops < 1:
            raise LooplabError(f"--lm-loops must be >= 1, got {args.lm_loops}")
        ignored = [
            flag
            for flag, value in (
                ("--scaling", args.scaling),
                ("--lengths", args.lengths),
                ("--max-loops", args.max_loops),
            )
            if value
        ]
        if ignored:
            raise LooplabError(
                f"--lm-loops reads the validation loss at 1..T loops; {', '.join(ignored)} belong to the "
                "exact-match evaluation and would be ignored: drop them"
            )
        summary = evaluate_lm_run(
            args.run_dir, max_loops=args.lm_loops, samples=args.samples or DEFAULT_SAMPLES, progress=True
        )
        print(json.dumps(summary, indent=2))
        print(f"\nwrote {Path(args.run_dir) / 'eval'}/lm_loops.csv, lm_loops.png and lm_summary.json")
        return
    from looplab.eval.run import eval_dir
    from looplab.rundir import load_run_config

    summary = evaluate_run(args.run_dir, args.lengths, args.max_loops, args.samples, args.scaling, progress=True)
    print(format_summary(summary))
    written = eval_dir(Path(args.run_dir), load_run_config(args.run_dir), args.lengths, args.max_loops, args.samples)
    print(f"\nwrote {written}: grid.parquet, samples.parquet, policy_depths.parquet and summary.json")
    print(f"next: looplab analyze {args.run_dir}   (fixed points, attention across loops, ColSum stages)")


def _analyze(args) -> None:
    from looplab.analysis.run import analyze_pca, analyze_spectral, format_spectral
    from looplab.analysis.text import format_mechanistic

    out = Path(args.out) if args.out else Path(args.run_dir) / "analysis"
    if args.out:
        _check_analysis_out(Path(args.out))
    if args.kind == "mechanistic":
        from looplab.analysis.mechanistic import analyze_config, analyze_mechanistic

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
            summary = analyze_config(load_config(args.run_dir, args.set), args.out, **options)
        else:
            if args.set:
                raise LooplabError("--set applies to a config file; a run dir's config is fixed")
            summary = analyze_mechanistic(args.run_dir, out=args.out, **options)
        print(format_mechanistic(summary))
        written = "summary.json, CSVs and plots" if not args.no_plots else "summary.json and CSVs"
        print(f"wrote {args.out or out / 'mechanistic'}: {written}")
    elif args.kind == "spectral":
        if args.iters < 1:
            raise LooplabError(f"--iters must be >= 1, got {args.iters}")
        summary = analyze_spectral(
            args.run_dir,
            args.length,
            args.loops,
            args.samples,
            args.iters,
            args.out,
            _exact_loops(args.exact_at, args.loops, args.run_dir),
            progress=True,
        )
        print(format_spectral(summary))
        print(f"wrote {out}/spectral.csv, spectral.json, spectral.png")
    else:
        if args.sample < 0:
            raise LooplabError(f"--sample must be >= 0 (the index of the traced sample), got {args.sample}")
        summary = analyze_pca(args.run_dir, args.length, args.loops, args.sample, args.out, progress=True)
        print(f"explained variance: {', '.join(f'{100 * v:.1f}%' for v in summary['explained_variance'])}")
        print(f"wrote {out}/pca_2d.png, pca_3d.png")


def _check_analysis_out(out: Path) -> None:
    """Refuse an analysis ``--out`` whose files it would overwrite: an evaluation, a run or a sweep dir."""
    from looplab.rundir import CONFIG_FILE, SWEEP_FILE, is_sweep_dir

    if is_sweep_dir(out):
        raise LooplabError(f"--out {out} is a sweep dir (it holds {SWEEP_FILE}); write the analysis elsewhere")
    for marker, kind in (
        ("grid.parquet", "an evaluation"),
        ("lm_summary.json", "an evaluation"),
        (CONFIG_FILE, "a run"),
    ):
        if (out / marker).is_file():
            raise LooplabError(f"--out {out} is {kind} dir (it holds {marker}); write the analysis elsewhere")


def _exact_loops(text: str | None, loops: int | None, run_dir: str) -> list[int] | None:
    """``--exact-at``: None (the default loops), [] for ``none``, every loop for ``all``, or the listed loops."""
    if text is None:
        return None
    if text == "none":
        return []
    if text == "all":
        from looplab.rundir import load_run_config

        return list(range(1, (loops or load_run_config(run_dir).eval.max_loops) + 1))
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise LooplabError(f"--exact-at takes loops like 1,8,64, or all, or none; got {text!r}") from None


def _sweep(args, sweep_file: Path) -> None:
    from looplab.sweep import load_sweep, run_sweep

    if args.address and args.backend != "ray":
        raise LooplabError(f"--address names a Ray cluster; it needs --backend ray (got --backend {args.backend})")
    began = time.perf_counter()
    spec = load_sweep(sweep_file)
    frame = run_sweep(
        spec, args.out, args.workers, args.backend, args.address, not args.no_progress, sweep_file.read_text()
    )
    results = Path(args.out) / "results.parquet"
    if frame.attrs.get("ran", 1) == 0:
        print(f"sweep: already done, all {len(frame)} runs finished earlier; results in {results}")
    else:
        print(
            f"sweep: {frame.attrs.get('ran', len(frame))} runs finished in {time.perf_counter() - began:.0f} s "
            f"({len(frame)} in all); results in {results}"
        )
    print(f"next: looplab report {args.out}   (add --paper {'|'.join(PAPERS)} for the paper's numbers)")


def _report(sweep_dir: str, paper: str | None) -> None:
    from looplab.report import write_report

    out = write_report(Path(sweep_dir), paper)
    print((out / "table.md").read_text())
    print(f"wrote {out}: table.md, table.tex, table.csv, plots and report.html")


def _reproduce(args) -> None:
    extra = STUDY_EXTRAS.get(args.study)
    if extra is not None:  # validated, and the pretrained model found, before anything runs
        from looplab.lm.pretrained import require_smollm2
        from looplab.lm.stars_study import load_study

        study = load_study(PRESETS / extra)
        require_smollm2()
    _sweep(args, PRESETS / "sweeps" / f"{args.study}.toml")
    if extra is not None:
        from looplab.lm.stars_study import run_study

        began = time.perf_counter()
        run_study(study, args.out, progress=not args.no_progress)
        print(f"retrofit: finished in {time.perf_counter() - began:.0f} s; results in {Path(args.out) / 'retrofit'}")
    _report(args.out, args.study.split("-")[0])


def _pool(args) -> None:
    from looplab.tasks import TASKS
    from looplab.tasks.pool import draw_pool, save_pool

    if args.task not in TASKS:
        raise choice_error("task", args.task, TASKS)
    task = TASKS[args.task]
    low, high = task.min_size, task.max_train_size or task.max_size
    bad = [n for n in args.sizes if n < low or (high is not None and n > high)]
    if not args.sizes or bad:
        raise LooplabError(f"--sizes must be {low}..{high if high is not None else 'any'} for {args.task}, got {bad}")
    for name in ("count", "workers"):
        if getattr(args, name) < 1:
            raise LooplabError(f"--{name} must be >= 1, got {getattr(args, name)}")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise LooplabError(f"--out {out} must be a file path in an existing directory")
    sizes = sorted(set(args.sizes))
    print(f"pool: {args.count} x {args.task} at sizes {', '.join(map(str, sizes))}, {args.workers} worker(s)")
    began = time.perf_counter()
    drawn = draw_pool(args.task, args.alphabet, sizes, args.count, args.seed, args.workers)
    save_pool(out, args.task, args.alphabet, args.seed, drawn)
    seconds = time.perf_counter() - began
    total = args.count * len(sizes)
    print(f"pool: wrote {out}: {total} instances in {seconds:.1f} s ({total / seconds:.1f}/s)")
    print(f'next: set task.pool = "{out}" in a config that trains {args.task} on these sizes')


def _results(args) -> int:
    from looplab.report.pages import regenerate

    if args.collect:
        from looplab.report.pages import collector

        frame = collector(args.study)([Path(d) for d in args.collect], Path(args.dir) / args.study)
        print(f"results: {len(frame)} rows -> {Path(args.dir) / args.study}")
    changed = regenerate(args.dir, check=args.check)
    if args.check and changed:
        print(f"results: out of date: {', '.join(map(str, changed))} (run: looplab results)", file=sys.stderr)
        return 1
    print(f"results: {len(changed)} page(s) {'to rewrite' if args.check else 'rewritten'} in {args.dir}")
    return 0


def _generate(args) -> None:
    from looplab.config import fixed_exit_depth
    from looplab.generation import ExitRule, Sampling
    from looplab.generation.text import generate_text, unescape
    from looplab.rundir import load_run_config

    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            prompts += Path(args.prompts_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise LooplabError(f"cannot read prompts file {args.prompts_file}: {err}") from None
    if not prompts:
        raise LooplabError("no prompt: give --prompt TEXT (repeatable) or --prompts-file FILE")
    config = load_run_config(args.run_dir)
    loops = args.loops or fixed_exit_depth(config.eval.fixed_exit, config.eval.max_loops)
    stops = [unescape(text) for text in args.stop]
    completions, result = generate_text(
        args.run_dir,
        prompts,
        args.max_new_tokens,
        ExitRule(args.exit, loops, args.eps, args.threshold),
        args.cache,
        Sampling(args.temperature, args.top_k, args.seed),
        stops,
        args.keep_loops,
    )
    for completion in completions:
        print(f"{completion.prompt!r} -> {completion.text!r}")
        if args.show_depths:
            print(f"  loops per token: {' '.join(map(str, completion.depths))}")
    depths = [d for c in result.depths for d in c]
    print(
        f"generate: {len(depths)} tokens, {args.exit} exit (loops {loops}), mean depth {result.mean_depth:.2f} "
        f"(min {min(depths)}, max {max(depths)}), {args.cache} cache {result.cache_bytes / 2**20:.2f} MiB"
    )


def _demo(args) -> None:
    from looplab.eval.run import evaluate_run, format_summary
    from looplab.train.trainer import train

    config = load_config(PRESETS / "demo.toml")
    began = time.perf_counter()
    print(
        f"demo: {config.task.name}, train lengths {config.task.train_min}..{config.task.train_max}, "
        f"schedule {config.schedule.name}, {config.train.steps} steps -> {args.out}"
    )
    train(config, Path(args.out))
    summary = evaluate_run(args.out, progress=True)
    print(format_summary(summary))
    print(f"\ndemo finished in {time.perf_counter() - began:.0f} s; results in {Path(args.out) / 'eval'}")


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; ``looplab analyze [OPTIONS] RUN_DIR`` is the mechanistic analysis."""
    argv = list(argv)
    if len(argv) >= 2 and argv[0] == "analyze" and argv[1] not in ANALYSES and argv[1] not in ("-h", "--help"):
        argv.insert(1, "mechanistic")
    return _parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # --help, or a usage error already printed as one line
        return stop.code if isinstance(stop.code, int) else 2
    try:
        for option in ("out", "run_dir", "sweep_dir", "config", "sweep_file"):
            if isinstance(getattr(args, option, None), str) and not getattr(args, option).strip():
                raise LooplabError(f"{option.replace('_', ' ')} must not be empty")
        if args.command == "train":
            _train(args)
        elif args.command == "eval":
            _eval(args)
        elif args.command == "config":
            from looplab.experiment import check_config

            config = load_config(args.config, args.set)
            check_config(config)  # completes [schedule] and [stability] with their components' defaults
            print(config.to_toml(), end="")
        elif args.command == "analyze":
            _analyze(args)
        elif args.command == "sweep":
            _sweep(args, resolve_preset(args.sweep_file))
        elif args.command == "report":
            _report(args.sweep_dir, args.paper)
        elif args.command == "reproduce":
            _reproduce(args)
        elif args.command == "results":
            return _results(args)
        elif args.command == "generate":
            _generate(args)
        elif args.command == "demo":
            _demo(args)
        elif args.command == "pool":
            _pool(args)
    except KeyboardInterrupt:
        print("looplab: interrupted", file=sys.stderr)
        return 130
    except Stopped as stop:  # asked to stop (preemption, Ctrl-C): not an error, and resumable
        if os.environ.get("RANK", "0") == "0":
            print(f"looplab: {stop}", file=sys.stderr)
        return stop.exit_code
    except Exception as err:  # the one error boundary: a line, not a traceback
        if os.environ.get("LOOPLAB_DEBUG") == "1":
            raise
        print(f"looplab: error: {describe_error(err)}", file=sys.stderr)
        return err.exit_code if isinstance(err, LooplabError) else 2
    return 0


def describe_error(err: Exception) -> str:
    """One line naming the problem: the message of a looplab error, the file and reason of an OS error."""
    import torch

    first_line = (str(err).strip().splitlines() or [""])[0]
    if isinstance(err, LooplabError):
        return first_line
    if isinstance(err, OSError):
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror or first_line}{where}"
    if isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)):
        return f"out of memory ({first_line or type(err).__name__}); use a smaller model, batch or depth"
    if isinstance(err, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({first_line})"
    return f"{type(err).__name__}: {first_line} (LOOPLAB_DEBUG=1 shows the traceback)"
