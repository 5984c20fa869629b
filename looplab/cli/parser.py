"""The ``looplab`` argument parser: every command, its arguments and the examples ``--help`` shows."""

from __future__ import annotations

import argparse

from looplab import __version__
from looplab.analysis.registry import AnalysisOptions
from looplab.cli.generate_args import DTYPE_HELP, TOKENIZER_HELP, WEIGHTS_HELP, add_generate
from looplab.config import PRESETS
from looplab.lm.model_dir import INJECTIONS
from looplab.plotting import FIGURE_PRESETS

ANALYSES = ("mechanistic", "spectral", "pca")
ANALYSIS = AnalysisOptions()  # the mechanistic analysis's defaults
#: the reproduction sweeps: configs/sweeps/<paper>-<scale>.toml, each named after a registered paper
STUDIES = tuple(sorted(path.stem for path in (PRESETS / "sweeps").glob("*.toml")))
#: the papers' names as the reproduction sweeps give them, for help texts; ``report`` checks ``--paper``
#: against the registry itself, once the studies are loaded (a test keeps the two equal)
PAPER_NAMES = tuple(sorted({study.split("-")[0] for study in STUDIES}))


def lengths_arg(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 8,12,16, got {text!r}") from None


def names_arg(text: str) -> list[str]:
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
        "looplab eval models/hrm --text notes.txt --max-loops 16 --out runs/hrm-eval   (a model dir)",
    ],
    "retrofit": [
        "looplab retrofit models/smollm2 --prelude 4 --core 6 --coda 4 --injection mix --out models/smollm2-loop",
        "looplab retrofit models/llama --prelude 0 --core 16 --coda 0 --injection state --out models/llama-1x",
    ],
    "show": ["looplab config show demo", "looplab config show demo --set schedule.name=rl_halting"],
    "mechanistic": [
        "looplab analyze runs/demo",
        "looplab analyze mechanistic runs/demo --loops 64 --samples 4 --no-mlp-ablation",
        "looplab analyze mechanistic runs/demo --zero-mlp core0 --out runs/demo/analysis/zero-core0",
        "looplab analyze mechanistic mechanistic/ablation-pre-injection --out runs/init   (an untrained model)",
        "looplab analyze mechanistic models/hrm --text notes.txt --loops 16 --samples 4   (a model dir)",
    ],
    "spectral": [
        "looplab analyze spectral runs/demo --loops 64 --exact-at all",
        "looplab analyze spectral models/hrm --text notes.txt --loops 16 --window 32",
    ],
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
        "looplab generate runs/lm --prompt 'And God said' --exit kl --exit-param eps=0.01 --loops 16",
        "looplab generate models/hrm --prompt 'And God said' --loops 8 --cache per_loop --json",
        "looplab generate runs/lm --prompt 'And God said' --loops 8 --draft-loops 2 --draft-tokens 4",
    ],
    "serve": [
        "looplab serve runs/lm --port 8000",
        "looplab serve models/smollm2-retrofit --max-running 16 --max-queue 64",
        "looplab serve runs/lm --replicas 2 --port 8000",
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="looplab", description="Looped transformers: train, evaluate, analyse.")
    parser.add_argument("--version", action="version", version=f"looplab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model from a TOML config")
    train.add_argument("config", help="config TOML file")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a key")
    train.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="train data-parallel on N local processes (torchrun's launcher; one line if a rank fails)",
    )

    evaluate = commands.add_parser(
        "eval",
        help="evaluate a run on the length x loops grid (a text run, or a model dir with --text: loss against loops)",
    )
    evaluate.add_argument("run_dir", help="a looplab run dir (config.toml), or a model dir (config.json) with --text")
    evaluate.add_argument("--lengths", type=lengths_arg, help="comma-separated instance sizes, e.g. 8,12,16")
    evaluate.add_argument(
        "--max-loops", type=int, help="unroll depth T_eval (a model dir: loops 1..N, default 4x its native loops)"
    )
    evaluate.add_argument(
        "--samples",
        type=int,
        help="samples per length (a model dir: windows read, default 64, fewer for a large model)",
    )
    evaluate.add_argument(
        "--scaling", action="store_true", help="also write the test-time scaling curve (eval/scaling.csv, scaling.png)"
    )
    evaluate.add_argument(
        "--lm-loops",
        type=int,
        metavar="T",
        help="text (kjv, kjv_arithmetic) runs: validation loss (and reasoning) against loops 1..T "
        "(eval/lm_loops.csv; default: the run's eval.max_loops)",
    )
    evaluate.add_argument("--out", help="a model dir's output folder (default DIR/eval)")

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
    mechanistic.add_argument(
        "run_dir", help="a run dir, a config TOML (its untrained initialisation), or a model dir with --text"
    )
    mechanistic.add_argument(
        "--loops", type=int, help=f"unroll depth (default {ANALYSIS.loops}; a model dir: 4x its native loops)"
    )
    mechanistic.add_argument(
        "--samples",
        type=int,
        help=f"instances (default {ANALYSIS.samples}; a model dir: windows, fewer for a large model)",
    )
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
        "--metrics", type=names_arg, default=[], help="comma-separated metrics to compute (default: all)"
    )
    mechanistic.add_argument("--no-plots", action="store_true", help="write summary and CSVs only")
    for sub in (spectral, pca):
        sub.add_argument("run_dir")
        sub.add_argument("--length", type=int, help="instance size (default: the longest training length)")
        sub.add_argument(
            "--loops", type=int, help="unroll depth (default: eval.max_loops; a model dir: 2x (spectral) or 4x native)"
        )
        sub.add_argument("--out", help="output folder (default RUN_DIR/analysis)")
    spectral.add_argument(
        "--samples", type=int, help="instances measured (default 4; a model dir: windows, fewer for a large model)"
    )
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
    for sub in (evaluate, mechanistic, spectral, pca):  # a model dir (config.json): the user's text
        sub.add_argument("--text", metavar="FILE", help="a model dir: the UTF-8 text read, in windows of its tokens")
        sub.add_argument(
            "--window",
            type=int,
            help="a model dir: tokens per window (default 256 for eval, 64 for analyze; at most the model's positions)",
        )
        sub.add_argument("--dtype", choices=("float32", "bfloat16"), help=DTYPE_HELP)
        sub.add_argument("--device", help="a model dir: cpu (default), cuda or cuda:N")
        sub.add_argument("--tokenizer", metavar="DIR", help=TOKENIZER_HELP)
    evaluate.add_argument("--weights", help=WEIGHTS_HELP)

    retrofit = commands.add_parser(
        "retrofit",
        help="write a Llama-family model dir as a looped (prelude, core x r, coda) model dir with an injection",
    )
    retrofit.add_argument(
        "source_dir",
        help="a Llama, Mistral, Qwen2 or Qwen3 model dir (config.json, safetensors), or a GGUF file of one",
    )
    retrofit.add_argument("--prelude", type=int, required=True, metavar="P", help="layers run once before the loop")
    retrofit.add_argument("--core", type=int, required=True, metavar="K", help="layers looped (>= 1)")
    retrofit.add_argument("--coda", type=int, required=True, metavar="C", help="layers run once after the loop")
    retrofit.add_argument(
        "--injection",
        choices=INJECTIONS,
        required=True,
        help="W_I: mix [I/2 | I/2], state [0 | I] (no injection), input [I | 0], sum [I | I]",
    )
    retrofit.add_argument("--out", required=True, help="the retrofit's model dir (new or empty)")

    export = commands.add_parser(
        "export", help="write a run fine-tuned from a model dir back as a model dir in its published layout"
    )
    export.add_argument("run_dir", help="a looplab run dir trained with model.pretrained = DIR")
    export.add_argument("--out", required=True, help="the model dir to write (new or empty)")

    sweep = commands.add_parser("sweep", help="train and evaluate a grid of configs x overrides x seeds")
    sweep.add_argument("sweep_file", help="sweep TOML file")
    report = commands.add_parser("report", help="tables, plots and report.html from a sweep dir")
    reproduce = commands.add_parser(
        "reproduce", help="run a paper's study at CPU (-small) or paper (-paper) scale, then its report"
    )
    for sub in (evaluate, mechanistic, spectral, pca, report, reproduce):
        sub.add_argument(
            "--figsize",
            choices=list(FIGURE_PRESETS),
            default="screen",
            help="figure size and fonts: screen (default), paper (3.25 in per column, text >= 7 pt), slide",
        )
    report.add_argument("sweep_dir")
    report.add_argument(
        "--paper", metavar="PAPER", help=f"put this paper's numbers side by side ({', '.join(PAPER_NAMES)})"
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

    add_generate(commands)

    pool = commands.add_parser(
        "pool", help="draw training instances that are slow to draw (9x9 Sudoku, large mazes) once, for task.pool"
    )
    pool.add_argument("task", help="a registered task, e.g. sudoku9 or maze")
    pool.add_argument("--sizes", type=lengths_arg, required=True, help="comma-separated instance sizes, e.g. 40,45,50")
    pool.add_argument("--count", type=int, required=True, help="instances per size")
    pool.add_argument("--seed", type=int, default=0, help="the pool's own seed (default 0)")
    pool.add_argument("--alphabet", type=int, default=8, help="the task's alphabet (default 8)")
    pool.add_argument("--workers", type=int, default=1, help="processes drawing in parallel (default 1)")
    pool.add_argument("--out", required=True, help="the pool file to write (safetensors)")

    demo = commands.add_parser("demo", help="train and evaluate a small binary-addition model (minutes on a CPU)")
    demo.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")

    serve = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (/v1/completions) with continuous batching, depth per token"
    )
    serve.add_argument("model_dir", help="a looplab run dir of a text task, or a model dir")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument("--dtype", help=DTYPE_HELP)
    serve.add_argument("--device", default="cpu", help="where the model runs, e.g. cuda (default cpu)")
    serve.add_argument("--weights", help=WEIGHTS_HELP)
    serve.add_argument("--tokenizer", metavar="DIR", help=TOKENIZER_HELP)
    serve.add_argument("--max-running", type=int, default=32, help="requests decoded at once (default 32)")
    serve.add_argument("--max-queue", type=int, default=64, help="requests that may wait; more get 503 (default 64)")
    serve.add_argument(
        "--kv-memory",
        type=float,
        metavar="GIB",
        help="GiB the running requests' KV caches may take together; a request that does not fit waits, one that "
        "could never fit gets 400 (default: half of the device's memory beside the weights)",
    )
    serve.add_argument(
        "--dense-kv",
        action="store_true",
        help="continuous and depth batches keep dense KV caches of their own, reserved whole when made, instead of the "
        "paged pool (faster steps at long contexts; nothing is preempted)",
    )
    serve.add_argument(
        "--prefix-cache",
        type=float,
        metavar="GIB",
        help="GiB of the KV memory kept prompt blocks may hold, for later requests that begin alike (per_loop "
        "cache, continuous batching; default: a quarter of --kv-memory; 0: off)",
    )
    serve.add_argument(
        "--max-token-loops",
        type=int,
        default=2**20,
        metavar="W",
        help="the most one request may cost: (prompt + max_tokens) × loops over its prompts; more get 400 "
        "(default 1,048,576)",
    )
    serve.add_argument(
        "--batching",
        choices=("continuous", "exact", "cohort", "depth"),
        default="continuous",
        help="continuous (default): a request (greedy, sampled or scoring, at any exit) joins the running batch "
        "of the requests that share its cache policy (per_loop and shared share one, paged) at the next step; depth: "
        "continuous, and each core call runs "
        "one loop of every per_loop or shared request's token that it can batch, each at its own loop (a request's "
        "tokens cost its own loops); "
        "exact: each request's rows alone, results equal to a solo run bit for bit; cohort: batch only the "
        "requests admitted together",
    )
    serve.add_argument("--replicas", type=int, default=1, help="N > 1: N replicas behind Ray Serve's HTTP proxy")
    serve.add_argument("--ray-address", help="a running Ray cluster to deploy the replicas on (default: a local head)")
    return parser
