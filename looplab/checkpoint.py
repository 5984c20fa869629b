"""Checkpoints: safetensors for tensors, JSON for everything else; never pickle.

Layout: ``RUN_DIR/checkpoints/step_XXXXXXX/`` holds ``model.safetensors``
(plus ``schedule.safetensors`` for a learned schedule), ``optimizer.safetensors``
with ``optimizer.json``, and ``state.json``. A checkpoint is written into a hidden temporary folder and
renamed into place, so a kill at any moment leaves either the complete new
checkpoint or none; older ones are pruned only after the new one exists.

Tied weights (a pretrained LM's embedding and output head: one tensor under two names, which
safetensors refuses to write twice) are written once, under the first name the module's
state dict gives them; loading finds the same ties in the module and fills the other names
from it (:func:`tied_names`), so the file holds each tensor once and the ties hold after loading.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from looplab.errors import LooplabError, one_line

CHECKPOINT_DIR = "checkpoints"


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if p.name[5:].isdigit() and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoint_dirs(run_dir)
    return found[-1] if found else None


def tied_names(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """name → the first name of the same tensor, for every name of ``state`` but the first of each tensor
    (one storage, offset, shape and stride: a tied weight); empty when nothing is tied."""
    first: dict[tuple, str] = {}
    tied = {}
    for name, tensor in state.items():
        if tensor.numel() == 0:  # an empty tensor has no storage to share
            continue
        where = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tensor.shape,
            tensor.stride(),
        )
        if where in first:
            tied[name] = first[where]
        else:
            first[where] = name
    return tied


def saved_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of ``module``: its state dict, or the keys it names in ``saved_keys`` (a model
    dir fine-tuned through adapters: the frozen weights are the dir's, read from it again)."""
    state = module.state_dict()
    saved = getattr(module, "saved_keys", None)
    return state if saved is None else {key: value for key, value in state.items() if key in saved}


def _module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict as it is written: each tied tensor once, contiguous, on the CPU."""
    state = saved_state(module)
    tied = tied_names(state)
    return {k: v.detach().cpu().contiguous() for k, v in state.items() if k not in tied}


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into flat tensors and JSON-able metadata."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())


def save_checkpoint(
    run_dir: Path, step: int, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer, state: dict, keep: int
) -> Path:
    """Atomically write the checkpoint of ``step``; keep the newest ``keep`` ones.

    Each of ``modules`` goes to ``<name>.safetensors``; ``state`` to state.json.
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for name, module in modules.items():
            save_file(_module_tensors(module), tmp / f"{name}.safetensors")
        opt_tensors, opt_meta = _optimizer_tensors(optimizer)
        save_file(opt_tensors, tmp / "optimizer.safetensors")
        _write_json(tmp / "optimizer.json", opt_meta)
        # state.json last: its presence marks the checkpoint complete.
        _write_json(tmp / "state.json", {"step": step, **state})
    except Exception as err:  # a full disk, a file-size limit, ...: the checkpoints already there are kept
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
        kept = latest_checkpoint(run_dir)
        raise LooplabError(
            f"cannot write checkpoint {final} ({reason}); {f'kept {kept}' if kept else 'no earlier checkpoint'}"
        ) from None
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise LooplabError(f"checkpoint file missing: {path}")
    try:
        return load_file(path)
    except Exception as err:  # safetensors raises several types for damaged files
        raise LooplabError(f"checkpoint file {path} is corrupt ({type(err).__name__}: {err})".splitlines()[0]) from None


def load_weights(checkpoint: Path, modules: dict[str, nn.Module]) -> None:
    """Load each module from ``<name>.safetensors``, checking names and shapes."""
    for name, module in modules.items():
        _load_module(Path(checkpoint) / f"{name}.safetensors", module)


def _load_module(path: Path, module: nn.Module) -> None:
    tensors = _load_tensors(path)
    expected = saved_state(module)
    tied = tied_names(expected)
    expected = {k: v for k, v in expected.items() if k not in tied}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [k for k in expected if k in tensors and tensors[k].shape != expected[k].shape]
    kinds = [k for k in expected if k in tensors and tensors[k].is_floating_point() != expected[k].is_floating_point()]
    if kinds:  # load_state_dict would cast integers to floats (or back) without a word
        raise LooplabError(
            f"checkpoint {path} does not match the model: {kinds[0]} is stored as {tensors[kinds[0]].dtype}, "
            f"the model holds {expected[kinds[0]].dtype}"
        )
    if missing or unexpected or wrong:
        if missing or unexpected:
            detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        else:
            detail = (
                f"shape of {wrong[0]} is {tuple(tensors[wrong[0]].shape)}, "
                f"config wants {tuple(expected[wrong[0]].shape)}"
            )
        raise LooplabError(f"checkpoint {path} does not match the model config: {detail}")
    partial = getattr(module, "saved_keys", None) is not None
    module.load_state_dict({**tensors, **{name: tensors[kept] for name, kept in tied.items()}}, strict=not partial)


def read_state(checkpoint: Path) -> dict:
    path = Path(checkpoint) / "state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LooplabError(f"checkpoint state {path} is unreadable: {err}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or isinstance(state["step"], bool):
        raise LooplabError(f"checkpoint state {path} is corrupt: it has no integer 'step'")
    if state["step"] < 0 or path.parent.name != f"step_{state['step']:07d}":
        raise LooplabError(
            f"checkpoint state {path} is corrupt: its step {state['step']} does not match its folder "
            f"{path.parent.name}; nothing was changed"
        )
    return state


def load_checkpoint(checkpoint: Path, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer) -> dict:
    """Restore modules and optimizer; return the JSON state (with ``step``)."""
    load_weights(checkpoint, modules)
    tensors = _load_tensors(Path(checkpoint) / "optimizer.safetensors")
    path = Path(checkpoint) / "optimizer.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list):
            raise ValueError("not a JSON object with a list of param_groups")
        optimizer.load_state_dict(_optimizer_state(tensors, meta))
    except (OSError, UnicodeDecodeError, KeyError, ValueError, TypeError, AttributeError, IndexError) as err:
        detail = f"it lacks {err}" if isinstance(err, KeyError) else one_line(err)
        raise LooplabError(f"checkpoint optimizer state {path} is corrupt or mismatched: {detail}") from None
    return read_state(checkpoint)
