"""The files of a model directory looplab reads before any weights: config.json, the weights' presence and
the tokenizer, each refused in one line naming the file."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from looplab.errors import LooplabError, one_line
from looplab.io import read_json_object
from looplab.lm.families import CONFIG_CLASS_NAMES

__all__ = ["CONFIG_FILE", "INJECTION_FILE", "TOKENIZER_FILES", "check_files", "load_tokenizer", "read_config_json"]

CONFIG_FILE = "config.json"
INJECTION_FILE = "injection.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def read_config_json(path: Path) -> dict:
    """The dir's config.json as a dict with a ``model_type`` (Parcae's from its ``_class_name``); one line when it
    is not a transformers model config."""
    file = path / CONFIG_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise LooplabError(f"{file} is not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise LooplabError(f"{file} is not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise LooplabError(f"{file} names no model_type: it is not a transformers model config")
    if "model_type" not in data and data.get("_class_name") in CONFIG_CLASS_NAMES:  # Parcae's checkpoints
        data = {**data, "model_type": CONFIG_CLASS_NAMES[data["_class_name"]]}
    if not isinstance(data.get("model_type"), str):
        raise LooplabError(f"{file} names no model_type: it is not a transformers model config")
    return data


def check_files(path: Path, state_dict_ok: bool, tokenizer: Path | None) -> None:
    """Refuse a dir without weights looplab reads, or without a tokenizer (beside them, or in ``tokenizer``).
    ``state_dict_ok``: a family looplab builds also reads ``pytorch_model.bin``, by the weights-only loader."""
    from looplab.lm.weights import PICKLE_FILE

    names = {entry.name for entry in path.iterdir()}
    if not any(name.endswith(".safetensors") and name != INJECTION_FILE for name in names):
        if not (state_dict_ok and PICKLE_FILE in names):
            pickled = sorted(name for name in names if name.endswith((".bin", ".pt", ".pth")))
            if pickled:
                raise LooplabError(
                    f"{path} holds its weights as {pickled[0]} (pickle); looplab reads safetensors "
                    + (f"(or a weights-only {PICKLE_FILE})" if state_dict_ok else "only")
                    + ": re-save the model with save_pretrained"
                )
            raise LooplabError(
                f"{path} holds no safetensors weights (model.safetensors, as save_pretrained writes them)"
            )
    where = tokenizer or path
    if not where.is_dir():
        raise LooplabError(f"the tokenizer folder {where} is not a directory (one holding tokenizer.json)")
    if not {entry.name for entry in where.iterdir()} & set(TOKENIZER_FILES):
        hint = (
            ""
            if tokenizer
            else (
                "; give the folder holding it (--tokenizer DIR; lm-eval: tokenizer=DIR; a fine-tune: "
                "model.pretrained_tokenizer)"
            )
        )
        raise LooplabError(
            f"{where} holds no tokenizer ({' / '.join(TOKENIZER_FILES[:2])}, as tokenizer.save_pretrained writes "
            f"them){hint}"
        )


def load_tokenizer(path: Path):
    """The dir's tokenizer (transformers' AutoTokenizer, local files only, no remote code); one line when it
    cannot be loaded."""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    # AutoTokenizer reads config.json as a bare config (never its auto_map: no remote code runs, and no
    # prompt asks whether it may), and warns that a model_type it does not know (ouro, huginn_raven: the
    # families looplab builds) is not that config's, or that Ouro's published rope_scaling field is deprecated;
    # the tokenizer is unaffected
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises many kinds here; each is one line for the user
        for name in ("tokenizer_config.json", "tokenizer.json"):  # a damaged one is named (transformers does not)
            if (Path(path) / name).is_file():
                read_json_object(Path(path) / name, "tokenizer file")
        first = one_line(err)
        raise LooplabError(f"cannot load the tokenizer of {path}: {first}") from None
    finally:
        logging.set_verbosity(verbosity)
    return tokenizer
