"""Writing a retrofit as a model dir (``looplab retrofit``), from a Llama-family model dir or a GGUF file of one:
:func:`write_retrofit` writes the source's config, tokenizer and weights beside ``retrofit.json`` (the split
and the injection) and ``injection.safetensors`` (W_I), which :func:`looplab.lm.model_dir.open_model_dir`
opens as a retrofit; :func:`open_gguf` reads a GGUF file of a source (its weights dequantised by
transformers' GGUF reader when the retrofit is written).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from looplab.errors import LooplabError, one_line
from looplab.lm.model_dir import (
    DTYPES,
    INJECTION_FILE,
    RETROFIT_FILE,
    RETROFIT_SOURCES,
    ModelDir,
    RetrofitSplit,
    max_window,
    meta_model,
    stay_offline,
    supported_models,
)

__all__ = ["open_gguf", "write_retrofit"]


def write_retrofit(source: ModelDir, split: RetrofitSplit, out: str | Path) -> Path:
    """Write the retrofit of ``source`` with ``split`` into ``out`` (a new or empty directory): the source's
    config, tokenizer and weights by ``save_pretrained``, ``retrofit.json`` and W_I in ``injection.safetensors``.

    Everything is checked first (the source is a Llama-family decoder and not itself a retrofit, the
    split fits its layers, ``out`` is new or empty, the weights fit in memory); the files are written
    into a hidden sibling folder renamed into place at the end, so a failure leaves no partial retrofit.
    """
    from safetensors.torch import save_file

    from looplab.model.looped import injection_weight

    out = Path(out)
    if source.kind == "native":
        raise LooplabError(
            f"{source.path} is a native looped LM ({source.model_type}): it loops by itself; retrofit takes "
            f"{', '.join(sorted(RETROFIT_SOURCES))}"
        )
    if source.kind == "retrofit":
        raise LooplabError(f"{source.path} is already a retrofit ({source.name}): retrofit its source instead")
    split.check(source.layers)
    if out.is_file():
        raise LooplabError(f"--out {out} is a file; give a new or empty directory")
    if out.is_dir() and any(out.iterdir()):
        raise LooplabError(f"--out {out} exists and is not empty; give a new or empty directory")
    dtype = getattr(source.config, "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype not in DTYPES.values():
        dtype = torch.float32
    source.check_fits(dtype, "cpu", "retrofitting")
    import transformers

    cls = getattr(transformers, RETROFIT_SOURCES[source.model_type][0])
    if source.gguf_file is None:
        model = cls.from_pretrained(source.path, dtype=dtype, local_files_only=True, use_safetensors=True)
    else:
        model = _plain(cls.from_pretrained(source.path, gguf_file=source.gguf_file, dtype=dtype, local_files_only=True))
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(staging)
        source.tokenizer.save_pretrained(staging)
        weight = injection_weight(split.injection, source.width, 0.25, torch.float32, torch.device("cpu"))
        save_file({"weight": weight.contiguous()}, str(staging / INJECTION_FILE))
        description = {
            "prelude": split.prelude,
            "core": split.core,
            "coda": split.coda,
            "injection": split.injection,
            "source": str(source.path.resolve()),
            "source_layers": source.layers,
        }
        (staging / RETROFIT_FILE).write_text(json.dumps(description, indent=2) + "\n")
        os.replace(staging, out)  # onto a missing or empty directory
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _plain(model: nn.Module) -> nn.Module:
    """A GGUF model as a plain float one: transformers dequantises its weights on loading but keeps it
    marked as quantised, which ``save_pretrained`` refuses; the same weights in a model of the config
    without its quantisation entry save as any other."""
    import copy

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = next(model.parameters()).dtype
    plain = type(model)(config).to(dtype)
    plain.load_state_dict(model.state_dict())
    return plain.eval()


def open_gguf(file: str | Path) -> ModelDir:
    """A GGUF file of a Llama-family decoder opened as a retrofit ``source`` (its config and tokenizer read by
    transformers' GGUF reader; the weights are dequantised only when :func:`write_retrofit` loads them)."""
    file = Path(file)
    if not file.is_file():
        raise LooplabError(f"GGUF file not found: {file}")
    stay_offline()
    import transformers

    folder, name = file.parent, file.name
    try:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as err:  # gguf and transformers raise many kinds for a foreign file; one line each
        first = one_line(err)
        raise LooplabError(f"cannot read {file} as a GGUF model: {first}") from None
    if config.model_type not in RETROFIT_SOURCES:
        raise LooplabError(
            f"{file} holds model_type {config.model_type!r}, which looplab does not loop; {supported_models()}"
        )
    model_class, _ = RETROFIT_SOURCES[config.model_type]
    meta = meta_model(getattr(transformers, model_class), config)
    layers, parameters = len(meta.model.layers), sum(p.numel() for p in meta.parameters())
    del meta
    heads, width = int(config.num_attention_heads), int(config.hidden_size)
    window = max_window(config.model_type, config)
    return ModelDir(folder, "source", config.model_type, config, tokenizer, parameters, layers, None, 1, window,
                    heads, width, name)  # fmt: skip
