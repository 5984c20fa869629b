"""looplab's tools on a model directory (:mod:`looplab.lm.model_dir`), run on a user's text with the
model's own tokenizer: loss against loops here, the analyses in :mod:`looplab.text.model_dir_analyses`.

The text. A UTF-8 file, tokenised as a whole by the model's tokenizer, without special tokens, and
cut from its start into consecutive windows of ``window`` tokens (the tail shorter than a window is
dropped; at most ``samples`` windows are read). A window is one row: every token is valid, and its
``window − 1`` next-token predictions are scored. A text shorter than one window is refused.

    evaluate_text          OUT/lm_loops.csv (loops, loss, tokens), lm_loops.png and lm_summary.json:
                           mean next-token cross-entropy (nats) over every scored position of every
                           window after 1..max_loops loops, all from one unroll per batch

What every tool here shares: :func:`prepare` (the windows, checked before the weights are read),
:func:`check_out`, :func:`run_header`, the time estimate (:func:`time_estimate`) and the activation memory
(:func:`activation_bytes`). Every argument, the model dir, the tokenizer, the text and the memory estimate
are checked before the weights are read, and all of it before anything is written.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.io import atomic_write, read_utf8_text
from looplab.lm.dtypes import DTYPES
from looplab.lm.model_dir import ModelDir, not_looped, open_model_dir
from looplab.model.protocol import readouts_by_loops
from looplab.progress import Progress
from looplab.text.compute import budgeted_windows, estimate_line, pass_flops
from looplab.text.evaluate import next_token_nll, plot_lm_loops

__all__ = [
    "EVAL_WINDOW",
    "EVAL_SAMPLES",
    "ANALYSIS_WINDOW",
    "LOOPS_FACTOR",
    "text_windows",
    "text_loss_by_loops",
    "evaluate_text",
    "prepare",
    "check_out",
    "run_header",
    "windows_phrase",
    "time_estimate",
    "activation_bytes",
]

#: default windows in tokens (capped by the model's own longest): evaluation, and the analyses, which
#: keep attention maps of window² per head, layer and loop
EVAL_WINDOW, ANALYSIS_WINDOW = 256, 64
#: default loops: this many times the model's native loop count (the spectral analysis, whose power iteration
#: costs tens of Jacobian–vector products a loop: SPECTRAL_LOOPS_FACTOR times)
LOOPS_FACTOR, SPECTRAL_LOOPS_FACTOR = 4, 2
#: default windows read by the evaluation
EVAL_SAMPLES = 64
#: windows per batch of the evaluation's unroll
BATCH = 8
CSV_FILE, PLOT_FILE, SUMMARY_FILE = "lm_loops.csv", "lm_loops.png", "lm_summary.json"


def text_windows(tokenizer, text: str, window: int, samples: int, source: str) -> Tensor:
    """[N, window] token ids: the first N = min(samples, tokens // window) consecutive windows of the text."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    if len(ids) < window:
        raise LooplabError(
            f"text {source} is {len(ids)} tokens under the model's tokenizer, shorter than one window of "
            f"{window} (--window): give a longer text or a smaller --window"
        )
    count = min(samples, len(ids) // window)
    return torch.tensor(ids[: count * window], dtype=torch.long).view(count, window)


def _window(model_dir: ModelDir, window: int | None, default: int) -> int:
    """``--window``, or the default capped by the model's longest window; checked against that longest."""
    if window is None:
        return min(default, model_dir.max_window)
    if not 2 <= window <= model_dir.max_window:
        raise LooplabError(
            f"--window must lie in 2..{model_dir.max_window} tokens for {model_dir.path} (its positions or "
            f"attention window), got {window}"
        )
    return window


def prepare(
    path,
    tokenizer,
    text,
    window: int | None,
    default_window: int,
    samples: int | None,
    loops: int | None,
    loops_option: str,
    dtype: str,
    device: str,
    passes=None,
    usual: int = 1,
    factor: int = LOOPS_FACTOR,
) -> tuple[ModelDir, Tensor, int, torch.dtype]:
    """Open the model dir (``tokenizer``: the tokenizer's folder, where the dir holds none) and read the text's
    windows; check the loops (``loops_option`` names them) and samples. ``samples`` None: ``usual`` windows,
    fewer for a large model (:func:`budgeted_windows` of ``passes(model_dir, loops)``, the loop passes one
    window costs). Nothing is loaded yet."""
    from looplab.experiment import check_device

    if dtype not in DTYPES:
        raise LooplabError(f"unknown --dtype {dtype!r}; valid choices: {', '.join(DTYPES)}")
    try:
        check_device(device)
    except LooplabError as err:  # the same check as a run's, named by this command's flag
        raise LooplabError(str(err).replace("run.device =", "--device").replace("run.device", "--device")) from None
    if samples is not None and samples < 1:
        raise LooplabError(f"--samples must be >= 1, got {samples}")
    model_dir = open_model_dir(path, tokenizer)
    if model_dir.kind == "source":
        raise not_looped(model_dir)
    loops = factor * model_dir.native_loops if loops is None else loops
    model_dir.check_loops(loops, loops_option)
    window = _window(model_dir, window, default_window)
    if samples is None:
        samples = budgeted_windows(model_dir.parameters, window, passes(model_dir, loops), usual)
    windows = text_windows(model_dir.tokenizer, read_utf8_text(text, "--text"), window, samples, str(text))
    return model_dir, windows, loops, DTYPES[dtype]


def check_out(out: Path) -> None:
    """Refuse an output folder that is a file, a model dir or a looplab run dir."""
    if out.is_file():
        raise LooplabError(f"--out {out} is a file; give a directory")
    for marker, kind in (("config.json", "a model"), ("config.toml", "a run")):
        if (out / marker).is_file():
            raise LooplabError(f"--out {out} is {kind} dir (it holds {marker}); write elsewhere")


@torch.no_grad()
def text_loss_by_loops(
    model, windows: Tensor, max_loops: int, batch_size: int = BATCH, progress: bool = False
) -> pd.DataFrame:
    """``loops`` 1..max_loops, ``loss`` (mean next-token cross-entropy in nats over every scored position)
    and ``tokens`` (the positions scored) of a protocol model on windows [N, W], one unroll per batch.
    A position whose logits are not finite counts as an infinite loss."""
    device = next(model.parameters()).device
    nll = torch.zeros(max_loops, dtype=torch.float64)
    batches = range(0, len(windows), batch_size)
    with Progress("eval", len(batches) * max_loops, unit="loop", enabled=progress) as bar:
        for start in batches:
            tokens = windows[start : start + batch_size].to(device)
            valid = torch.ones_like(tokens, dtype=torch.bool)
            scored = valid.clone()
            scored[:, -1] = False  # the last token predicts nothing inside its window
            target = tokens[:, 1:].reshape(-1)
            for t, (_, logits) in enumerate(readouts_by_loops(model, tokens, valid, max_loops, at=scored)):
                nll[t] += next_token_nll(logits, target)[0].sum().cpu()
                bar.advance(detail=f"loop {t + 1}")
    count = windows.shape[0] * (windows.shape[1] - 1)
    return pd.DataFrame({"loops": range(1, max_loops + 1), "loss": (nll / count).tolist(), "tokens": count})


def activation_bytes(model_dir: ModelDir, rows: int, window: int, dtype: torch.dtype) -> int:
    """A rough upper bound of one batch's forward: a few states of every layer kind, the attention maps of
    one layer, and the logits in float32."""
    vocab = int(getattr(getattr(model_dir.config, "text_config", None) or model_dir.config, "vocab_size", 0))
    per_token = 16 * model_dir.width * torch.finfo(dtype).bits // 8 + 4 * (model_dir.heads * window + 2 * vocab)
    return rows * window * per_token


def evaluate_text(
    path,
    text,
    max_loops: int | None = None,
    window: int | None = None,
    samples: int | None = None,
    out=None,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer=None,
    progress: bool = False,
    weights: str = "float",
) -> dict:
    """Loss against loops 1..max_loops (default 4 × native) on ``samples`` windows of ``text`` (default
    :data:`EVAL_SAMPLES`, fewer for a large model: :mod:`looplab.text.compute`): writes ``out`` (default
    DIR/eval)/lm_loops.csv, lm_loops.png and lm_summary.json; returns the summary. ``weights``
    ``int8``: the linear layers as int8 (:mod:`looplab.lm.int8`), their quality cost in the summary."""
    from looplab.lm.int8 import check_weights, held_text_quality

    check_weights(weights, device)
    model_dir, windows, max_loops, torch_dtype = prepare(
        path,
        tokenizer,
        text,
        window,
        EVAL_WINDOW,
        samples,
        max_loops,
        "--max-loops",
        dtype,
        device,
        lambda _, k: k,
        EVAL_SAMPLES,
    )
    out = Path(out) if out is not None else model_dir.path / "eval"
    check_out(out)
    rows = min(BATCH, len(windows))
    model_dir.check_fits(
        torch_dtype, device, "evaluating", activation_bytes(model_dir, rows, windows.shape[1], torch_dtype)
    )
    if progress:
        print(
            f"eval: {model_dir.path} ({model_dir.name}, native loops {model_dir.native_loops}): "
            f"{windows_phrase(len(windows))} of {windows.shape[1]} tokens of {text}, loops 1..{max_loops}: "
            + time_estimate(model_dir, len(windows) * max_loops, windows.shape[1], torch_dtype, device),
            flush=True,
        )
    model = model_dir.load(torch_dtype, device)
    quality = None
    if weights == "int8":
        quality = held_text_quality(model, model_dir.tokenizer, model_dir.native_loops)
        if progress:
            print(f"eval: {quality.line()}", flush=True)
    frame = text_loss_by_loops(model, windows, max_loops, progress=progress)
    summary = _loss_summary(frame, model_dir)
    summary.update(
        {
            "model": str(model_dir.path),
            "model_type": model_dir.model_type,
            "kind": model_dir.kind,
            "text": str(text),
            "window": int(windows.shape[1]),
            "windows": len(windows),
            "dtype": dtype,
            "weights": weights,
            "int8_quality": None if quality is None else asdict(quality),
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / CSV_FILE, lambda p: frame.to_csv(p, index=False))
    title = f"{model_dir.path.name}: loss on {Path(text).name}"
    plot_lm_loops(
        frame, out / PLOT_FILE, model_dir.native_loops, title, token="token", line="loss", depth_label="native loops"
    )
    atomic_write(out / SUMMARY_FILE, lambda p: p.write_text(json.dumps(summary, indent=2)))
    return summary


def _loss_summary(frame: pd.DataFrame, model_dir: ModelDir) -> dict:
    def at(k: int) -> float | None:
        rows = frame.loc[frame.loops == k, "loss"]
        return float(rows.iloc[0]) if len(rows) else None

    finite = frame[frame.loss.map(math.isfinite)]
    best = finite.loc[finite.loss.idxmin()] if len(finite) else None
    return {
        "native_loops": model_dir.native_loops,
        "loss_at_native_loops": at(model_dir.native_loops),
        "best_loss": None if best is None else float(best.loss),
        "best_loops": None if best is None else int(best.loops),
        "max_loops": int(frame.loops.max()),
        "loss_at_max_loops": at(int(frame.loops.max())),
        "tokens": int(frame.tokens.iloc[0]),
    }


def run_header(model_dir: ModelDir, text, windows: Tensor, loops: int, dtype: str) -> dict:
    return {
        "model": str(model_dir.path),
        "model_type": model_dir.model_type,
        "kind": model_dir.kind,
        "native_loops": model_dir.native_loops,
        "text": str(text),
        "dtype": dtype,
        "checkpoint": None,
        "steps_trained": None,
        "loops": loops,
        "samples": len(windows),
        "length": int(windows.shape[1]),
    }


def windows_phrase(count: int) -> str:
    return f"{count} window{'' if count == 1 else 's'}"


def time_estimate(model_dir: ModelDir, passes: float, window: int, dtype: torch.dtype, device: str) -> str:
    """The time ``passes`` loop passes over windows of ``window`` tokens take here (:func:`estimate_line`)."""
    return estimate_line(passes * pass_flops(model_dir.parameters, window), dtype, device, window)
