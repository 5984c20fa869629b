"""The commands on one run: ``train``, ``eval``, ``generate``, ``config show``, ``pool`` and ``demo``."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from looplab.config import PRESETS, load_config
from looplab.errors import LooplabError, choice_error


def train_command(args) -> int | None:
    """``looplab train CONFIG --out RUN_DIR``: train (or resume) a run; ``--nproc N``: on N processes."""
    from looplab.experiment import load_checked_config
    from looplab.train.stop import stop_on_signals
    from looplab.train.trainer import train

    # A stop signal is recorded from the start, so one that arrives while the command sets up is honoured
    # (before training: nothing to save; during it: at the next step, after a checkpoint) instead of killing it.
    with stop_on_signals() as stop:
        config = load_checked_config(args.config, args.set)
        if args.nproc != 1 and "WORLD_SIZE" not in os.environ:  # the launcher, not a rank
            from looplab.train.launch import launch

            argv = ["train", args.config, "--out", args.out, *(f"--set={item}" for item in args.set)]
            return launch(config, args.nproc, argv + ["--no-progress"] * args.no_progress, Path(args.out), stop)
        train(config, Path(args.out), progress=not args.no_progress)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one line for the run, not one per rank
        print(f"trained: {args.out}")
        print(f"next: looplab eval {args.out}   (then: tensorboard --logdir {Path(args.out) / 'tensorboard'})")


def eval_command(args) -> None:
    """``looplab eval RUN_DIR``: the length × loops grid (or, for a text run, loss against loops); ``looplab eval
    DIR --text FILE`` on a model dir: loss against loops on the text (``looplab.cli.models``)."""
    from looplab.cli.models import eval_model_dir, takes_model_dir
    from looplab.eval.run import evaluate_run, format_summary
    from looplab.rundir import load_run_config
    from looplab.text.evaluate import evaluate_lm_run, text_loops

    if takes_model_dir(args, {"out": "--out"}):  # config.json: a transformers model dir, read on --text
        return eval_model_dir(args)
    config = load_run_config(args.run_dir)
    loops = text_loops(config, args.lm_loops)
    if loops is not None:
        ignored = [
            flag
            for flag, value in (
                ("--scaling", args.scaling),
                ("--lengths", args.lengths),
                ("--max-loops", args.max_loops),
            )
            if value is not None and value is not False  # given, even as 0
        ]
        if ignored:
            raise LooplabError(
                f"--lm-loops reads the validation loss at 1..T loops; {', '.join(ignored)} belong to the "
                "exact-match evaluation and would be ignored: drop them"
            )
        if args.samples is not None and args.samples < 1:
            raise LooplabError(f"--samples must be >= 1, got {args.samples}")
        summary = evaluate_lm_run(
            args.run_dir, max_loops=loops, samples=args.samples or config.eval.samples, progress=True
        )
        print(json.dumps(summary, indent=2))
        print(f"\nwrote {Path(args.run_dir) / 'eval'}/lm_loops.csv, lm_loops.png and lm_summary.json")
        return
    evaluation = evaluate_run(args.run_dir, args.lengths, args.max_loops, args.samples, args.scaling, progress=True)
    print(format_summary(evaluation))
    print(f"\nwrote {evaluation.folder}: grid.parquet, samples.parquet, policy_depths.parquet and summary.json")
    print(f"next: looplab analyze {args.run_dir}   (fixed points, attention across loops, ColSum stages)")


def generate_command(args) -> None:
    """``looplab generate DIR --prompt TEXT``: continue prompts with a trained text run or a model dir (a native
    looped LM or a retrofit, with its own tokenizer). ``--json``: one JSON object per prompt on stdout (its
    prompt and prompt token ids, the new token ids, their text, the loops each ran and its log-probability);
    the summary line then goes to stderr, so stdout is JSON Lines."""
    from looplab.cli.models import refuse_model_dir_flags
    from looplab.generation import Sampling
    from looplab.generation.fields import check_fields, decode_options
    from looplab.generation.text import generate_text, unescape
    from looplab.generation.text_lm import open_text_lm
    from looplab.lm.dtypes import default_dtype
    from looplab.lm.int8 import check_weights
    from looplab.lm.model_dir import is_model_dir
    from looplab.plugins import load_plugins
    from looplab.rundir import load_run_config

    prompts = list(args.prompt)
    sources = [f"--prompt {index + 1}" for index in range(len(prompts))]
    if args.prompts_file:
        lines = _read_prompts(args.prompts_file)
        prompts += lines
        sources += [f"--prompts-file {args.prompts_file} line {number + 1}" for number in range(len(lines))]
    if not prompts:
        raise LooplabError("no prompt: give --prompt TEXT (repeatable) or --prompts-file FILE")
    stops = [unescape(text) for text in args.stop]
    if "" in stops:
        raise LooplabError("--stop '' is empty: a stop string needs at least one character (every text holds '')")
    load_plugins(args.plugin)  # and the installed packages' entry points
    fields = _decode_fields(args)
    check_weights(args.weights or "float", "cpu")
    refuse_model_dir_flags(args.run_dir, args, "read")
    if not is_model_dir(args.run_dir):
        load_run_config(args.run_dir)  # imports the run's plugins: their exits, caches and decoders are known
    check_fields(fields)  # an unknown exit, cache, decoder or parameter is refused before any weight is read
    dtype = args.dtype or default_dtype("cpu", args.weights or "float")  # generate decodes on the CPU
    lm = open_text_lm(args.run_dir, dtype, weights=args.weights or "float", tokenizer=args.tokenizer)
    if lm.weights_note:
        print(f"generate: {lm.weights_note}", file=sys.stderr)
    options = decode_options(fields, lm, Sampling(args.temperature, args.top_k, args.seed))
    completions, result = generate_text(lm, prompts, args.max_new_tokens, options, stops, sources)
    for completion, logprobs in zip(completions, result.logprobs):
        if args.json:
            print(json.dumps(_completion_json(completion, logprobs), ensure_ascii=False))
            continue
        print(f"{completion.prompt!r} -> {completion.text!r}")
        if args.show_depths:
            print(f"  loops per token: {' '.join(map(str, completion.depths))}")
    depths = [d for c in result.depths for d in c]
    rule = options.exit_rule
    print(
        f"generate: {len(depths)} tokens, {rule.name} exit (loops {rule.loops}), mean depth {result.mean_depth:.2f} "
        f"(min {min(depths)}, max {max(depths)}), {options.cache} cache {result.cache_bytes / 2**20:.2f} MiB"
        + _draft_summary(options, result),
        file=sys.stderr if args.json else sys.stdout,
    )


def _draft_summary(options, result) -> str:
    """The summary line's tail: the decoder unless ``step``, and for a speculative generation its drafts and
    the share kept."""
    if options.decoder != "speculative":
        return "" if options.decoder == "step" else f", {options.decoder} decoder"
    params = options.decoder_params
    kept = "n/a" if not result.drafted else f"{100 * result.acceptance:.1f} %"
    return (
        f", drafts of {params.draft_tokens} at {params.draft_loops} loops: {result.accepted}/{result.drafted} kept "
        f"({kept})"
    )


def _completion_json(completion, logprobs: list[float]) -> dict:
    """The ``--json`` object of one prompt."""
    return {
        "prompt": completion.prompt,
        "prompt_ids": completion.prompt_tokens,
        "token_ids": completion.tokens,
        "text": completion.text,
        "loops": completion.depths,
        "logprobs": [lp if math.isfinite(lp) else None for lp in logprobs],  # JSON has no NaN: null
    }


def _read_prompts(path: str) -> list[str]:
    """The lines of a prompts file, one prompt each; one-line errors naming the file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise LooplabError(f"prompts file {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise LooplabError(f"cannot read prompts file {path}: {err.strerror or err}") from None
    if not lines:
        raise LooplabError(f"prompts file {path} is empty: it holds one prompt per line")
    return lines


def _decode_fields(args) -> dict:
    """The decode fields of a ``looplab generate`` line (:mod:`looplab.generation.fields`): ``--loops``,
    ``--exit``, ``--cache``, ``--decoder`` and each chosen one's parameters from ``--exit-param``,
    ``--cache-param`` and ``--decoder-param KEY=VALUE`` (values read as TOML, else as text) and from the
    shorter flags (``--eps``, ``--threshold``, ``--keep-loops``, ``--max-batch``, ``--front``,
    ``--read-only-exit``, ``--draft-loops``, ``--draft-tokens``); ``--batching`` is the earlier ``--decoder``,
    and ``--draft-loops`` alone chooses ``speculative``."""
    if args.decoder is not None and args.batching is not None:
        raise LooplabError("--batching is the earlier spelling of --decoder: give one of them")
    decoder = args.decoder or args.batching
    if decoder is None and args.draft_loops is not None:
        decoder = "speculative"
    fields = {"loops": args.loops, "exit": args.exit, "cache": args.cache, "decoder": decoder}
    shorter = {
        "eps": args.eps, "threshold": args.threshold, "keep_loops": args.keep_loops, "max_batch": args.max_batch,
        "front": args.front, "read_only_exit": args.read_only_exit or None, "draft_loops": args.draft_loops,
        "draft_tokens": args.draft_tokens,
    }  # fmt: skip
    given = {key: "--" + key.replace("_", "-") for key, value in shorter.items() if value is not None}
    for flag in ("--exit-param", "--cache-param", "--decoder-param"):
        for key, value in _key_values(getattr(args, flag[2:].replace("-", "_")), flag).items():
            if key in fields or key in given:
                first = given.get(key, f"--{key}")
                raise LooplabError(f"{key} is given twice ({first} and {flag} {key}): give it once")
            fields[key], given[key] = value, f"{flag} {key}"
    fields.update({key: value for key, value in shorter.items() if value is not None})
    return fields


def _key_values(texts: list[str], flag: str) -> dict:
    """``KEY=VALUE`` texts as a dict, each value read as TOML (else as text); one-line errors naming ``flag``."""
    import tomllib

    found = {}
    for text in texts:
        key, equals, raw = (part.strip() for part in text.partition("="))
        if not equals or not key:
            raise LooplabError(f"{flag} {text!r} must look like KEY=VALUE, e.g. eps=0.01")
        if key in found:
            raise LooplabError(f"{flag} {key} is given twice: give it once")
        try:
            found[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            found[key] = raw
    return found


def config_command(args) -> None:
    """``looplab config show CONFIG``: the resolved config, every component's defaults filled in."""
    from looplab.experiment import load_checked_config

    config = load_checked_config(args.config, args.set)  # [schedule] and [stability] completed with their defaults
    print(config.to_toml(), end="")


def pool_command(args) -> None:
    """``looplab pool TASK``: draw a training pool once."""
    from looplab.memory import check_fits
    from looplab.tasks import TASKS, make_task
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
    task_instance = make_task(args.task, args.alphabet)
    # tokens and labels (int64) of every row, held while drawn, joined and written: three copies at most
    needed = 3 * 2 * 8 * args.count * sum(task_instance.body_len(n) for n in sizes)
    check_fits(f"a pool of {args.count} x {len(sizes)} instances", needed, "cpu", "draw fewer (--count)")
    print(f"pool: {args.count} x {args.task} at sizes {', '.join(map(str, sizes))}, {args.workers} worker(s)")
    began = time.perf_counter()
    drawn = draw_pool(args.task, args.alphabet, sizes, args.count, args.seed, args.workers)
    save_pool(out, args.task, args.alphabet, args.seed, drawn)
    seconds = time.perf_counter() - began
    total = args.count * len(sizes)
    print(f"pool: wrote {out}: {total} instances in {seconds:.1f} s ({total / seconds:.1f}/s)")
    print(f'next: set task.pool = "{out}" in a config that trains {args.task} on these sizes')


def demo_command(args) -> None:
    """``looplab demo``: train and evaluate the demo preset."""
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
