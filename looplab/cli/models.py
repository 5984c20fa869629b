"""The commands on a model directory (config.json + safetensors + tokenizer, ``looplab.lm.model_dir``):
``retrofit``, and ``eval`` / ``analyze mechanistic|spectral`` given a model dir instead of a run dir.

A command that takes a run dir tells the two apart by what the directory holds: ``config.json`` is a
model dir, ``config.toml`` a looplab run dir. A flag that belongs to the other kind is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from looplab.errors import LooplabError
from looplab.lm.dtypes import default_dtype

#: the flags only a model dir takes (argparse dest → how the command line spells it)
MODEL_FLAGS = {
    "text": "--text",
    "window": "--window",
    "dtype": "--dtype",
    "device": "--device",
    "weights": "--weights",
    "tokenizer": "--tokenizer",
}


def _quiet_transformers() -> None:
    """No progress bars or advice from transformers on the command line: looplab prints its own lines."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def takes_model_dir(args, extra_flags: dict[str, str] | None = None) -> bool:
    """Whether the command's directory (``args.run_dir``) is read as a model dir: it holds config.json, or it
    holds no config.toml and a model-dir flag is given (so its error is the model dir's). A run dir given a
    model-dir flag is refused."""
    from looplab.lm.model_dir import is_model_dir

    flags = {**MODEL_FLAGS, **(extra_flags or {})}
    given = [spelling for dest, spelling in flags.items() if getattr(args, dest, None) is not None]
    if is_model_dir(args.run_dir):
        return True
    if (Path(args.run_dir) / "config.toml").is_file():
        if given:
            raise LooplabError(
                f"only a model dir (config.json) takes {', '.join(given)}; {args.run_dir} is a looplab run dir "
                "(config.toml), which reads its own task's data: drop them"
            )
        return False
    return bool(given)


def refuse_model_dir_flags(path, args, how: str) -> None:
    """Refuse the model-dir flags ``args`` gives (``--dtype``, ``--weights``, ``--tokenizer``) when ``path`` is not
    a model dir: a looplab run is ``how`` ("read", "served") as it was trained."""
    from looplab.lm.model_dir import is_model_dir

    given = (MODEL_FLAGS[dest] for dest in ("dtype", "weights", "tokenizer") if getattr(args, dest) is not None)
    flag = next(given, None)
    if flag is not None and not is_model_dir(path):
        raise LooplabError(
            f"{flag} applies to a model dir (config.json); {path} is a looplab run, {how} as it was trained"
        )


def _refuse(args, flags: dict[str, str], why: str) -> None:
    """Refuse the run-dir flags given with a model dir (``why``: what the model dir reads instead)."""
    given = [spelling for dest, spelling in flags.items() if getattr(args, dest, None) not in (None, False, [])]
    if given:
        raise LooplabError(
            f"only a looplab run dir (config.toml) takes {', '.join(given)}; {args.run_dir} is a model dir "
            f"(config.json), {why}: drop them"
        )


def _text(args) -> str:
    if args.text is None:
        raise LooplabError(f"a model dir is read on a text: give --text FILE (UTF-8) with {args.run_dir}")
    return args.text


def eval_model_dir(args) -> None:
    """``looplab eval DIR --text FILE``: loss against loops 1..N on windows of the text."""
    from looplab.text.model_dirs import evaluate_text

    _refuse(args, {"lengths": "--lengths", "scaling": "--scaling", "lm_loops": "--lm-loops"}, "read on --text")
    _quiet_transformers()
    summary = evaluate_text(
        args.run_dir,
        _text(args),
        max_loops=args.max_loops,
        window=args.window,
        samples=args.samples,
        out=args.out,
        dtype=args.dtype or default_dtype(args.device or "cpu", args.weights or "float"),
        device=args.device or "cpu",
        progress=True,
        weights=args.weights or "float",
        tokenizer=args.tokenizer,
    )
    out = Path(args.out) if args.out else Path(args.run_dir) / "eval"
    print(format_loss_table(out / "lm_loops.csv", summary["native_loops"]))
    best, loops = summary["best_loss"], summary["best_loops"]
    best_text = "n/a (no finite loss)" if best is None else f"{best:.4f} at {loops} loop{'s' * (loops != 1)}"
    native = summary["loss_at_native_loops"]
    print(
        f"{summary['windows']} windows of {summary['window']} tokens, {summary['tokens']} tokens scored; "
        f"native loops {summary['native_loops']}: {'n/a' if native is None else f'{native:.4f}'}; best {best_text}"
    )
    print(f"wrote {out}/lm_loops.csv, lm_loops.png and lm_summary.json")


def format_loss_table(path: Path, native: int) -> str:
    """The loss-by-loops table ``eval`` prints (the native loop count starred)."""
    import pandas as pd

    frame = pd.read_csv(path)
    lines = ["loops  loss (nats/token)  tokens"]
    for row in frame.itertuples(index=False):
        star = "*" if row.loops == native else " "
        lines.append(f"{row.loops:>5}{star} {row.loss:>16.4f}  {row.tokens:>6}")
    return "\n".join(lines)


def analyze_model_dir(args, kind: str) -> None:
    """``looplab analyze mechanistic|spectral|pca DIR --text FILE``: the analysis on windows of the text."""
    from looplab.analysis.run import format_spectral
    from looplab.analysis.text import format_mechanistic
    from looplab.text.model_dir_analyses import analyze_text_mechanistic, analyze_text_spectral

    text = _text(args)
    common = {
        "window": args.window,
        "dtype": args.dtype or default_dtype(args.device or "cpu"),
        "device": args.device or "cpu",
        "tokenizer": args.tokenizer,
    }
    _quiet_transformers()
    if kind == "pca":
        from looplab.text.model_dir_analyses import analyze_text_pca

        _refuse(args, {"length": "--length"}, "read in --window tokens of --text")
        summary = analyze_text_pca(args.run_dir, text, args.loops, args.sample, args.out, **common)
        print(f"explained variance: {', '.join(f'{100 * v:.1f}%' for v in summary['explained_variance'])}")
        out = Path(args.out) if args.out else Path(args.run_dir) / "analysis"
        print(f"wrote {out}/pca_2d.png, pca_3d.png")
        return
    if kind == "mechanistic":
        _refuse(args, {"set": "--set"}, "whose config is fixed")
        summary = analyze_text_mechanistic(
            args.run_dir,
            text,
            out=args.out,
            progress=True,
            loops=args.loops,
            samples=args.samples,
            mlp_ablation=not args.no_mlp_ablation,
            zero_mlp=args.zero_mlp,
            metrics=args.metrics,
            plots=not args.no_plots,
            **common,
        )
        print(format_mechanistic(summary))
        out = Path(args.out) if args.out else Path(args.run_dir) / "analysis" / "mechanistic"
        written = "summary.json, CSVs and plots" if not args.no_plots else "summary.json and CSVs"
        print(f"wrote {out}: {written}")
        return
    _refuse(args, {"length": "--length"}, "read in --window tokens of --text")

    exact = "all" if args.exact_at == "all" else exact_loops(args.exact_at, args.loops, args.run_dir)
    summary = analyze_text_spectral(
        args.run_dir,
        text,
        loops=args.loops,
        samples=args.samples,
        iters=args.iters,
        out=args.out,
        exact_loops=exact,
        progress=True,
        **common,
    )
    print(format_spectral(summary))
    out = Path(args.out) if args.out else Path(args.run_dir) / "analysis"
    print(f"wrote {out}/spectral.csv, spectral.json, spectral.png")


def retrofit_command(args) -> None:
    """``looplab retrofit SOURCE_DIR|SOURCE.gguf --prelude P --core K --coda C --injection NAME --out DIR``."""
    from looplab.lm.model_dir import RetrofitSplit, open_model_dir
    from looplab.lm.retrofit_dir import open_gguf, write_retrofit

    _quiet_transformers()
    split = RetrofitSplit(args.prelude, args.core, args.coda, args.injection)
    source = open_gguf(args.source_dir) if args.source_dir.endswith(".gguf") else open_model_dir(args.source_dir)
    out = write_retrofit(source, split, args.out)
    first, last = split.prelude + split.core, source.layers - split.coda - 1  # the middle layers, dropped
    dropped = {0: "", 1: f", layer {first} dropped"}.get(last - first + 1, f", layers {first}..{last} dropped")
    print(
        f"retrofit: {source.model_type} with {source.layers} layers -> ({split.prelude}, {split.core}⊗r, "
        f"{split.coda}), {split.injection} injection{dropped}"
    )
    print(f"wrote {out}")
    print(f"next: looplab eval {out} --text FILE --max-loops 8")


def export_command(args) -> None:
    """``looplab export RUN --out DIR``: a run fine-tuned from a model dir, written back as a model dir."""
    from looplab.text.export import export_run

    _quiet_transformers()
    written = export_run(args.run_dir, args.out)
    merged = f", {written['merged']} LoRA adapters merged" if written["merged"] else ""
    print(f"export: {args.run_dir} ({written['family']}){merged} -> {args.out}: {', '.join(written['files'])}")
    print(f"next: looplab eval {args.out} --text FILE")


def exact_loops(text: str | None, loops: int | None, run_dir: str) -> list[int] | None:
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
