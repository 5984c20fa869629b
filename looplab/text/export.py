"""``looplab export RUN --out DIR``: a run fine-tuned from a model dir (``model.pretrained``) written back as a
model dir in its family's published layout, which transformers, vLLM and the llama.cpp converters read as
they read the original.

What is written: the run's latest weights (LoRA adapters merged into the weights they sit beside) under the
published names — through transformers' ``save_pretrained`` for the families it builds (HRM-Text, Inkling-2, a
retrofit's source), and as safetensors of the published module looplab builds for Ouro, Huginn, Nanbeige and
Parcae (whose own checkpoints are a pickled ``pytorch_model.bin``: looplab writes no pickle, and its tied head
once) — sharded past 5 GB with a ``model.safetensors.index.json``; the source dir's ``config.json`` (its
published fields, the dtype field set to what was written); the tokenizer; and for a retrofit its
``retrofit.json`` and fine-tuned W_I (``injection.safetensors``). The exported dir opens as the original does
(``looplab eval|generate|serve DIR``) and gives the run's logits.

Everything is checked before anything is written (a run not fine-tuned from a model dir, a non-empty
``--out``, ``--out`` under a file); the files are staged (:func:`looplab.io.staged`) and renamed into place
at the end, so a failure (a full disk) leaves none of them behind and overwrites nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from looplab.errors import LooplabError
from looplab.io import staged

__all__ = ["SHARD", "export_run", "merge_adapters"]

#: the largest shard written, as the hub's converters write them
SHARD = "5GB"


def merge_adapters(model: nn.Module) -> int:
    """Fold every LoRA adapter of ``model`` into the weight it sits beside and put the plain layer back in its
    place (in place); returns how many were merged."""
    from peft.tuners.lora import LoraLayer

    wrapped = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, LoraLayer)
    ]
    for parent, name, child in wrapped:
        child.merge()
        setattr(parent, name, child.get_base_layer())
    if wrapped:
        del model.saved_keys
    return len(wrapped)


def _check_out(out: Path) -> None:
    if out.is_file():
        raise LooplabError(f"--out {out} is a file; give a new or empty directory")
    if out.is_dir() and any(out.iterdir()):
        raise LooplabError(f"--out {out} exists and is not empty; give a new or empty directory (nothing overwritten)")
    blocked = next((place for place in out.parents if place.is_file()), None)
    if blocked is not None:
        raise LooplabError(f"--out {out}: {blocked} is a file, not a folder")


def _save_published(module: nn.Module, folder: Path, skip: set[str]) -> None:
    """``module``'s state dict (but ``skip``: a tied head) as safetensors shards of at most :data:`SHARD`, with
    an index when there is more than one (the hub's layout)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    state = {key: value.detach().contiguous() for key, value in module.state_dict().items() if key not in skip}
    split = split_torch_state_dict_into_shards(state, max_shard_size=SHARD)
    for file, keys in split.filename_to_tensors.items():
        save_file({key: state[key] for key in keys}, str(folder / file), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": split.tensor_to_filename}  # fmt: skip
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def export_run(run_dir: str | Path, out: str | Path) -> dict:
    """Write the run ``run_dir`` (fine-tuned from a model dir) as a model dir ``out`` (module docstring);
    returns what was written: ``family``, ``merged`` adapters, ``files``."""
    from looplab.experiment import Experiment
    from looplab.rundir import load_run_config

    run_dir, out = Path(run_dir), Path(out)
    config = load_run_config(run_dir)
    if not config.model.pretrained:
        raise LooplabError(
            f"{run_dir} trains looplab's own model (no model.pretrained): export writes back a run fine-tuned from "
            "a model dir; a looplab run is read as it is (its checkpoints)"
        )
    _check_out(out)
    exp = Experiment.from_run(run_dir)
    source, model = exp.source, exp.model
    merged = merge_adapters(model)
    try:
        with staged(out) as staging:
            _write(model, source, staging)
    except OSError as err:  # a full disk: the staged files are removed, none is left as if complete
        raise LooplabError(f"cannot write {out} ({err.strerror or err}); no file was left there") from None
    return {"family": source.name, "merged": merged, "files": sorted(p.name for p in out.iterdir())}


def _write(model: nn.Module, source, staging: Path) -> None:
    """The files of ``model`` (a run's adapter, its adapters merged) as a model dir of ``source``'s family, into
    ``staging`` (module docstring)."""
    from looplab.lm.dir_files import INJECTION_FILE
    from looplab.lm.model_dir import RETROFIT_FILE

    published = model.published
    if hasattr(published, "save_pretrained"):  # a family transformers builds, or a retrofit's source
        published.save_pretrained(staging, max_shard_size=SHARD)
    else:  # a family looplab builds: its module holds the published names
        tied = {"lm_head.weight"} if published.lm_head.weight is _embedding(published) else set()
        _save_published(published, staging, tied)
        config_json = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
        config_json["torch_dtype"] = str(next(published.parameters()).dtype).removeprefix("torch.")
        (staging / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    source.tokenizer.save_pretrained(staging)
    if source.kind == "retrofit":
        from safetensors.torch import save_file

        shutil.copyfile(source.path / RETROFIT_FILE, staging / RETROFIT_FILE)
        save_file({"weight": model.inject.weight.detach().float().contiguous()}, str(staging / INJECTION_FILE))


def _embedding(module: nn.Module) -> torch.Tensor | None:
    """The input embedding's weight of a published module (a tied head shares it)."""
    embed = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else None
    if embed is None:
        embed = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
    return None if embed is None else embed.weight
