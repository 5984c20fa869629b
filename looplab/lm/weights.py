"""Reading a model directory's weights into a module built by looplab (the families transformers does not have:
:mod:`looplab.lm.ouro`, :mod:`looplab.lm.huginn`, :mod:`looplab.lm.nanbeige`, :mod:`looplab.lm.parcae`), with
every key and shape checked first.

    weight_files(path)           the weight files of a dir: ``model.safetensors`` or the shards its
                                 ``model.safetensors.index.json`` names (every other ``*.safetensors``
                                 but looplab's own files, when there is no index); a dir with no
                                 safetensors may hold ``pytorch_model.bin`` (Parcae's checkpoints), read
                                 only by torch's weights-only loader: tensors, never code
    check_weights(module, path)  every key and shape against a module built on the meta device
    check_files(path)            the files readable and their weights floats (before transformers loads
                                 a dir: its own key renaming is checked after, check_transformers_load)
    load_weights(module, path)   the checked weights copied into ``module`` (built on the meta device:
                                 parameters are materialised in ``dtype`` on ``device`` as they are read)
    build_loaded(cls, config, path)  ``cls(config)`` built on the meta device, its weights read in and its
                                 tied head tied again

A missing key, an unexpected one and a mis-shaped one are each refused in one line naming the first few,
before any tensor is read; a weight stored as integers (a quantised checkpoint) is refused rather than
cast; a file that safetensors cannot read is named. A shard index names files inside the dir only (a
``..`` or absolute name is refused before any file is opened), each key in the shard it names, and no key
is stored in two files (the later would silently win: another model).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from looplab.errors import LooplabError, one_line

__all__ = [
    "build_loaded",
    "check_files",
    "check_finite",
    "check_transformers_load",
    "check_weights",
    "load_weights",
    "weight_files",
]

INDEX_FILE = "model.safetensors.index.json"
#: a PyTorch state dict, where a dir holds no safetensors (read by ``torch.load(weights_only=True)`` alone)
PICKLE_FILE = "pytorch_model.bin"
#: files in a model dir that are looplab's own, not the model's weights
OWN_FILES = ("injection.safetensors",)


def weight_files(path: Path) -> list[Path]:
    """The safetensors files holding a model dir's weights (see the module docstring)."""
    index = _index(path)
    if index is not None:
        return [path / name for name in sorted(set(index.values()))]
    files = sorted(p for p in path.glob("*.safetensors") if p.name not in OWN_FILES)
    if not files and (path / PICKLE_FILE).is_file():
        return [path / PICKLE_FILE]
    return files


#: torch dtype → the name safetensors' headers give it
_DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}


def _state_dict_file(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a PyTorch state-dict file, memory-mapped, read by torch's weights-only unpickler (which
    refuses any object but tensors and plain containers, so no code in the file runs). Refused in one line: a
    file that loader rejects (naming what it found), and one holding anything but a flat name → tensor map."""
    import pickle
    import zipfile

    try:  # memory-mapped where torch.save's zip format allows (older files are read whole)
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        raise LooplabError(f"{file} is not a weights-only PyTorch state dict: {one_line(err)}") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise LooplabError(f"{file} holds something other than a map of names to tensors; looplab reads weights only")
    return state


def _index(path: Path) -> dict[str, str] | None:
    """The weight map (key → file name) of the dir's shard index, or None without one. Refused in one line:
    an index that is not JSON with a weight_map of names, a name outside the dir (``..``, an absolute path, a
    link leading out), and a name the dir does not hold."""
    index = path / INDEX_FILE
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not all(isinstance(name, str) for name in weight_map.values()):
            raise TypeError
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise LooplabError(f"{index} is not a safetensors index (JSON with a weight_map)") from None
    root = path.resolve()
    for key, name in weight_map.items():
        if not (path / name).resolve().is_relative_to(root):
            raise LooplabError(f"{index} maps {key} to {name}, outside {path}: shards must lie in the model dir")
        if not (path / name).is_file():
            raise LooplabError(f"{index} names {name}, which {path} does not hold")
    return weight_map


def _headers(files: list[Path], index: dict[str, str] | None = None) -> dict[str, tuple[Path, list[int], str]]:
    """key → (file, shape, dtype name) of every tensor in ``files``, read from their headers alone. A key in
    two files is refused, and so is one the shard ``index`` (key → file name) places in another file."""
    from safetensors import safe_open

    found: dict[str, tuple[Path, list[int], str]] = {}
    for file in files:
        if file.suffix == ".bin":
            for key, tensor in _state_dict_file(file).items():
                found[key] = (file, list(tensor.shape), _DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype)))
            continue
        try:
            with safe_open(file, "pt") as handle:
                for key in handle.keys():
                    if key in found:
                        raise LooplabError(
                            f"weight {key} is stored twice, in {found[key][0]} and {file}: a model dir holds "
                            "each weight once"
                        )
                    piece = handle.get_slice(key)
                    found[key] = (file, list(piece.get_shape()), piece.get_dtype())
        except LooplabError:
            raise
        except Exception as err:  # safetensors raises its own kinds for a truncated or foreign file
            first = one_line(err)
            raise LooplabError(f"{file} is not a readable safetensors file: {first}") from None
    for key, name in (index or {}).items():
        if key in found and found[key][0].name != Path(name).name:
            raise LooplabError(
                f"{files[0].parent / INDEX_FILE} maps {key} to {name}, but {found[key][0].name} holds it"
            )
    return found


def stored_headers(path: Path) -> dict[str, tuple[Path, list[int], str]]:
    """:func:`_headers` of the dir's weight files, checked against its shard index where it has one."""
    return _headers(weight_files(path), _index(path))


def _first(keys, count: int = 3) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - count} more" if len(keys) > count else ""
    return ", ".join(keys[:count]) + more


def _shared_keys(module: nn.Module) -> dict[str, set[str]]:
    """key → the other keys of ``module``'s state dict that are the same tensor (tied weights)."""
    by_tensor: dict[int, set[str]] = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), set()).add(key)
    return {key: group - {key} for group in by_tensor.values() for key in group}


def check_weights(
    module: nn.Module,
    path: Path,
    ignored: tuple[str, ...] = (),
    tied: dict[str, str] | None = None,
) -> dict[str, tuple[Path, list[int], str]]:
    """Check the weights of the model dir ``path`` against ``module`` (on the meta device) from the files'
    headers alone, before any tensor is read; returns the headers (key → file, shape, dtype).

    Refused in one line: an unreadable file (named), a weight the module needs and no file holds (a
    weight tied to a stored one, by ``tied`` or by sharing its tensor in ``module``, need not be stored),
    a mis-shaped one (its key, both shapes and its file), one stored as integers (a quantised checkpoint),
    and a stored key the module does not have (other than ``ignored``).
    """
    stored = stored_headers(path)
    tied = tied or {}
    wanted = {key: tuple(t.shape) for key, t in module.state_dict(keep_vars=True).items()}
    shared = _shared_keys(module)
    optional = {key for key in wanted if key in tied or shared[key] & stored.keys()}
    missing = wanted.keys() - stored.keys() - optional
    if missing:
        raise LooplabError(f"{path} lacks {len(missing)} weight(s) the model needs: {_first(missing)}")
    unexpected = stored.keys() - wanted.keys() - set(ignored)
    if unexpected:
        raise LooplabError(f"{path} holds {len(unexpected)} weight(s) this model does not have: {_first(unexpected)}")
    for key in sorted(wanted.keys() & stored.keys()):
        file, shape, dtype = stored[key]
        if tuple(shape) != wanted[key]:
            raise LooplabError(
                f"{path}: weight {key} has shape {list(shape)} in {file.name}, the config needs {list(wanted[key])}"
            )
        if not dtype.startswith(("F", "BF")):
            raise LooplabError(
                f"{path}: weight {key} is stored as {dtype} in {file.name} (a quantised checkpoint); looplab "
                "reads float weights (float32, float16, bfloat16)"
            )
    return stored


def check_files(path: Path) -> None:
    """The model dir's weight files readable and their weights stored as floats (for the families
    transformers loads, whose own key renaming :func:`check_transformers_load` follows)."""
    for key, (file, _, dtype) in stored_headers(path).items():
        if key.endswith(".weight") and not dtype.startswith(("F", "BF")):
            raise LooplabError(
                f"{path}: weight {key} is stored as {dtype} in {file.name} (a quantised checkpoint); looplab "
                "reads float weights (float32, float16, bfloat16)"
            )


def check_transformers_load(info: dict, path: Path) -> None:
    """Refuse what transformers' ``from_pretrained`` reported (``output_loading_info``) but went on with: a
    weight no file held (started at random) or one of another shape (the key and both shapes)."""
    missing = info.get("missing_keys") or []
    if missing:
        raise LooplabError(f"{path} lacks {len(missing)} weight(s) the model needs: {_first(missing)}")
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        key, stored, needed = next(iter(sorted(mismatched)))
        raise LooplabError(f"{path}: weight {key} has shape {list(stored)}, the config needs {list(needed)}")


def check_finite(module: nn.Module, path: Path) -> None:
    """Refuse a loaded model with a NaN or infinite weight, naming the first."""
    bad = next(
        (key for key, t in module.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()), None
    )
    if bad is not None:
        raise LooplabError(f"{path}: weight {bad} holds NaN or infinite values")


def load_weights(
    module: nn.Module,
    path: Path,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    ignored: tuple[str, ...] = (),
    tied: dict[str, str] | None = None,
) -> None:
    """Copy the weights of the model dir ``path`` into ``module`` (parameters on the meta device, or real),
    checked first by :func:`check_weights` (``ignored``: stored keys the module need not read, a stored rotary
    table; ``tied``: module key → the stored key it shares its tensor with, an LM head tied to the embedding)."""
    from safetensors import safe_open

    stored = check_weights(module, path, ignored, tied)
    wanted = module.state_dict(keep_vars=True).keys()
    tensors = {}
    for file in sorted({file for file, _, _ in stored.values()}):
        if file.suffix == ".bin":
            tensors |= {k: v.to(dtype=dtype, device=device) for k, v in _state_dict_file(file).items() if k in wanted}
            continue
        with safe_open(file, "pt", device="cpu") as handle:
            for key in handle.keys():
                if key in wanted:
                    tensors[key] = handle.get_tensor(key).to(dtype=dtype, device=device)
    for key, source in (tied or {}).items():
        tensors[key] = tensors[source]
    module.load_state_dict(tensors, strict=True, assign=True)
    check_finite(module, path)


def build_loaded(
    cls,
    config,
    path: Path,
    dtype: torch.dtype,
    device: str | torch.device,
    embedding: str | None = None,
    ignored: tuple[str, ...] = (),
) -> nn.Module:
    """``cls(config)`` built on the meta device with the checked weights of the model dir ``path``
    (:func:`load_weights`); ``embedding``: the key of the embedding its ``lm_head`` is tied to (not stored
    again, and tied again after loading), None for an untied head. In eval mode."""
    with torch.device("meta"):
        model = cls(config)
    tied = {} if embedding is None else {"lm_head.weight": embedding + ".weight"}
    load_weights(model, path, dtype, device, ignored=ignored, tied=tied)
    if embedding is not None:
        model.lm_head.weight = model.get_submodule(embedding).weight
    return model.eval()
