"""A model directory — ``config.json``, safetensors weights and tokenizer files, as transformers'
``save_pretrained`` writes them — opened onto the looped-model protocol, nothing fetched from a hub.

What the directory holds decides what it is (a looplab run dir holds ``config.toml`` instead):

    native     config.json's model_type is one of the looped-LM families
               (:data:`looplab.lm.families.FAMILIES`: hrm_text, inkling2_loop, inkling2_loop_text,
               ouro, huginn_raven, nanbeige; or, with no model_type, its ``_class_name`` is Parcae's
               ``ParcaeConfig``); its adapter wraps the model — transformers' where transformers has
               the family, looplab's own (built from config.json, no remote code) where it has not —
               sharing its weights. ``auto_map`` is never read. A family looplab builds also reads
               ``pytorch_model.bin``, by torch's weights-only loader (tensors, never code); a tokenizer
               kept in another folder is named by ``tokenizer`` (``--tokenizer DIR``)
    retrofit   a Llama-family decoder (:data:`RETROFIT_SOURCES`) beside ``retrofit.json`` (the split and
               the injection) and ``injection.safetensors`` (W_I), as ``looplab retrofit`` writes
               them: a :class:`looplab.lm.retrofit.RetrofittedLoop` of the source's own layers
    source     the same decoder without ``retrofit.json``: not looped; ``looplab retrofit`` takes it,
               and takes a GGUF file of one too (``--source x.gguf``, dequantised by transformers'
               GGUF reader into float weights: :func:`looplab.lm.retrofit_dir.open_gguf`)

:func:`open_model_dir` reads everything but the weights — the config, the tokenizer, and the
parameter count of the model built on the meta device from config.json — so a directory that
is not a model, a missing tokenizer, an unsupported model_type and a model that does not fit
are each refused in one line before any weight is read. :meth:`ModelDir.load` then reads the
weights once, in float32 or bfloat16, onto the chosen device.

A retrofit's native loop count is 1: at one loop ``state``, ``mix`` and ``input`` run exactly the
source's layers 0..p+k−1 and its coda, which with p + k + c = L is the source model itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from looplab.errors import LooplabError, one_line
from looplab.lm.config_fields import boolean, check_fields, integer, positive_number, token_ids
from looplab.lm.dir_files import (
    CONFIG_FILE,
    INJECTION_FILE,
    check_files,
    load_tokenizer,
    read_config_json,
)
from looplab.lm.dtypes import DTYPES
from looplab.lm.families import CONFIG_CLASS_NAMES, LOOPED_FAMILIES
from looplab.memory import GIB, check_fits, device_bytes
from looplab.token_exits import MAX_LOOPS

__all__ = [
    "INJECTIONS",
    "LOOP_CAP",
    "RETROFIT_FILE",
    "RETROFIT_SOURCES",
    "ModelDir",
    "RetrofitSplit",
    "is_model_dir",
    "open_model_dir",
]

RETROFIT_FILE = "retrofit.json"
#: the loops any command runs a model dir at: 1..LOOP_CAP (the same cap as ``looplab generate``'s)
LOOP_CAP = MAX_LOOPS
#: the W_I choices ``looplab retrofit`` writes (``looplab.model.looped.injection_weight``)
INJECTIONS = ("mix", "state", "input", "sum")
#: model_type → (causal LM class, decoder layer class) of the decoders a retrofit takes: each one's
#: ``Model.forward`` is embed → decoder layers → final norm → lm_head, which RetrofittedLoop reproduces
RETROFIT_SOURCES = {
    "llama": ("LlamaForCausalLM", "LlamaDecoderLayer"),
    "mistral": ("MistralForCausalLM", "MistralDecoderLayer"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2DecoderLayer"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3DecoderLayer"),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2DecoderLayer"),  # norms after attention and MLP, q/k norms over all heads
}


def supported_models() -> str:
    """What looplab opens, as a refusal names it: the native families' model types and the retrofits' sources."""
    by_class = "".join(f"; {kind} by _class_name {name}" for name, kind in sorted(CONFIG_CLASS_NAMES.items()))
    return (
        f"supported: {', '.join(sorted(LOOPED_FAMILIES))} (native looped LMs{by_class}), and retrofits of "
        f"{', '.join(sorted(RETROFIT_SOURCES))} made by `looplab retrofit`"
    )


@dataclass(frozen=True)
class RetrofitSplit:
    """A retrofit's (prelude, core, coda) layer counts and its injection, as ``retrofit.json`` records them."""

    prelude: int
    core: int
    coda: int
    injection: str

    def check(self, layers: int) -> None:
        """Refuse a split that does not fit a source of ``layers`` decoder layers, in one line."""
        p, k, c = self.prelude, self.core, self.coda
        if min(p, c) < 0 or k < 1 or p + k + c > layers:
            raise LooplabError(
                f"a retrofit split needs --prelude >= 0, --core >= 1, --coda >= 0 and prelude + core + coda <= "
                f"{layers}, the source's layer count; got ({p}, {k}, {c})"
            )
        if self.injection not in INJECTIONS:
            raise LooplabError(f"unknown injection {self.injection!r}; valid choices: {', '.join(INJECTIONS)}")


def is_model_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a ``config.json`` (a transformers model dir)."""
    return (Path(path) / CONFIG_FILE).is_file()


@dataclass
class ModelDir:
    """An opened model directory: what config.json, retrofit.json and the tokenizer say, no weights yet.

    Attributes:
        path: the directory.
        kind: ``native``, ``retrofit`` or ``source`` (see the module docstring).
        model_type: config.json's model_type.
        config: transformers' config object.
        tokenizer: transformers' tokenizer, from the directory.
        parameters: the parameter count (of the model built on the meta device).
        layers: the decoder layers of a retrofit or source (None for a native model).
        split: a retrofit's split and injection (None otherwise).
        native_loops: the loop count the model runs by itself (a retrofit's: 1).
        max_window: the longest token window the model takes (its positions; a sliding window when shorter).
        heads: the most attention heads of a layer; width: the hidden size.
        linear_names: the qualified names of the model's linear layers (what ``train.adapter_targets`` names).
    """

    path: Path
    kind: str
    model_type: str
    config: Any
    tokenizer: Any
    parameters: int
    layers: int | None
    split: RetrofitSplit | None
    native_loops: int
    max_window: int
    heads: int
    width: int
    gguf_file: str | None = None  # a GGUF source: the file's name in ``path``, its folder
    linear_names: tuple[str, ...] = ()

    @property
    def exit_defaults(self) -> dict[str, dict]:
        """The generation exits' parameters this model's config sets (``[generate.exits.NAME]`` tables)."""
        family = LOOPED_FAMILIES.get(self.model_type) if self.kind == "native" else None
        return {} if family is None or family.exit_defaults is None else family.exit_defaults(self.config)

    @property
    def loop_cap(self) -> int:
        """The most loops a command runs this model at."""
        return LOOP_CAP

    @property
    def name(self) -> str:
        """How plots and lines name the model: ``model_type`` and the split of a retrofit."""
        if self.split is None:
            return self.model_type
        s = self.split
        return f"{self.model_type} retrofit ({s.prelude}, {s.core}⊗r, {s.coda}), {s.injection} injection"

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """The weights in ``dtype``: parameters × bytes per number (a retrofit's W_I, 2d² more, included)."""
        extra = 2 * self.width * self.width if self.kind == "retrofit" else 0
        return (self.parameters + extra) * torch.finfo(dtype).bits // 8

    def memory_line(self, dtype: torch.dtype, device: str) -> str:
        """What loading takes, in one line: the parameters, their bytes in ``dtype`` and what ``device`` holds."""
        name = next(key for key, value in DTYPES.items() if value == dtype)
        return (
            f"loading {self.name} from {self.path}: {self._count()} parameters, "
            f"{self.weight_bytes(dtype) / GIB:,.2f} GiB of weights in {name} ({device} holds "
            f"{device_bytes(device) / GIB:,.1f} GiB)"
        )

    def _count(self) -> str:
        return f"{self.parameters / 1e9:,.1f} B" if self.parameters >= 1e9 else f"{self.parameters / 1e6:,.1f} M"

    def check_fits(self, dtype: torch.dtype, device: str, what: str, extra_bytes: int = 0) -> None:
        """Refuse ``what`` (the weights in ``dtype`` and ``extra_bytes`` of work) when it does not fit ``device``."""
        name = next(key for key, value in DTYPES.items() if value == dtype)
        check_fits(
            f"{what} on {self.path} ({self._count()} parameters in {name}, {self.weight_bytes(dtype) / GIB:,.2f} GiB)",
            self.weight_bytes(dtype) + extra_bytes,
            device,
            "use --dtype bfloat16, a smaller model, or fewer --samples / a shorter --window"
            if dtype == torch.float32
            else "use a smaller model, or fewer --samples / a shorter --window",
        )

    def check_loops(self, loops: int, option: str) -> None:
        """Refuse a loop count outside 1..:attr:`loop_cap`, in one line naming ``option``."""
        if not 1 <= loops <= self.loop_cap:
            raise LooplabError(
                f"{option} must lie in 1..{self.loop_cap} for a model dir ({self.name}, native loops "
                f"{self.native_loops}), got {loops}"
            )

    def load(self, dtype: torch.dtype = torch.float32, device: str = "cpu", eager_experts: bool = False) -> nn.Module:
        """The model on the looped-model protocol, its weights read once in ``dtype`` onto ``device``, eval mode.

        ``eager_experts``: a mixture-of-experts layer runs transformers' eager expert loop instead of its
        grouped matmul (the latter has no forward-mode derivative, which the loop Jacobian needs).
        """
        if self.kind == "source":
            raise not_looped(self)
        stay_offline()
        import transformers

        options = {"dtype": dtype, "attn_implementation": "eager", "local_files_only": True, "use_safetensors": True}
        if eager_experts:
            options["experts_implementation"] = "eager"
        from looplab.lm.weights import check_files, check_finite, check_transformers_load

        options.update(output_loading_info=True, ignore_mismatched_sizes=True)  # refused below, with the key

        if self.kind == "native":
            family = LOOPED_FAMILIES[self.model_type]
            if family.model is not None:
                model = family.model.from_dir(self.path, self.config, dtype, device)
            else:
                cls = getattr(transformers, family.model_types[self.model_type])
                # transformers starts a missing weight at random and answers a mis-shaped one with an option
                # the user cannot set: the files are checked first, what it reports after
                check_files(self.path)
                with _transformers_quiet():
                    model, info = cls.from_pretrained(self.path, **options)
                check_transformers_load(info, self.path)
                model = model.to(device).eval()
                check_finite(model, self.path)
            looped = family.adapter.from_pretrained_model(model)
        else:
            from safetensors.torch import load_file

            from looplab.lm.retrofit import RetrofittedLoop

            cls = getattr(transformers, RETROFIT_SOURCES[self.model_type][0])
            check_files(self.path)
            with _transformers_quiet():
                model, info = cls.from_pretrained(self.path, **options)
            check_transformers_load(info, self.path)
            model = model.to(device).eval()
            check_finite(model, self.path)
            s = self.split
            looped = RetrofittedLoop(
                model, s.prelude, s.core, s.coda, copy_weights=False, inject_init=s.injection
            )  # shares the source's layers: the dropped middle ones go with ``model``
            weight = load_file(self.path / INJECTION_FILE)["weight"]
            with torch.no_grad():
                looped.inject.weight.copy_(weight.to(dtype=looped.inject.weight.dtype, device=device))
        runs = getattr(looped, "native_loops", 1)
        if runs != self.native_loops:  # the config read before loading and the adapter must agree
            raise LooplabError(f"{self.path}: the loaded model runs {runs} loops, its config {self.native_loops}")
        # the model in the published layout, sharing every tensor with the adapter (what ``looplab export``
        # writes back); kept out of the module tree, so the adapter's state dict names each tensor once
        object.__setattr__(looped, "published", model)
        return looped.eval()


def not_looped(model_dir: ModelDir) -> LooplabError:
    """The error for a source decoder given where a looped model is needed."""
    return LooplabError(
        f"{model_dir.path} is a {model_dir.model_type} model, not a looped one: make one of it with "
        f"`looplab retrofit {model_dir.path} --prelude P --core K --coda C --injection mix --out DIR`"
    )


@contextlib.contextmanager
def _transformers_quiet():
    """transformers' own reports (its LOAD REPORT table, progress bars) off while it loads: what it reports,
    looplab checks after and refuses in one line of its own (:func:`looplab.lm.weights.check_transformers_load`)."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def stay_offline() -> None:
    """Keep transformers and huggingface_hub off the network (every load also says local_files_only)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def meta_model(cls, config) -> nn.Module:
    """The model built on the meta device: its shapes and classes, no memory."""
    with torch.device("meta"):
        return cls(config)


def _built(cls, config, path: Path) -> nn.Module:
    """:func:`meta_model`, a config the class cannot build from refused in one line."""
    try:
        return meta_model(cls, config)
    except LooplabError:
        raise
    except Exception as err:  # a field out of the class's range fails somewhere inside its constructor
        first = one_line(err)
        raise LooplabError(
            f"{path}/{CONFIG_FILE}: {getattr(cls, '__name__', cls)} cannot be built from it ({first})"
        ) from None


def _read_split(path: Path, layers: int, width: int) -> RetrofitSplit:
    file = path / RETROFIT_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        split = RetrofitSplit(*(data[key] for key in ("prelude", "core", "coda", "injection")))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise LooplabError(
            f"{file} is not a retrofit description (JSON with prelude, core, coda and injection): "
            "write it with `looplab retrofit`"
        ) from None
    if not all(isinstance(n, int) for n in (split.prelude, split.core, split.coda)):
        raise LooplabError(f"{file}: prelude, core and coda must be integers")
    try:
        split.check(layers)
    except LooplabError as err:
        raise LooplabError(f"{file}: {err}") from None
    injection = path / INJECTION_FILE
    if not injection.is_file():
        raise LooplabError(f"{path} is a retrofit without its {INJECTION_FILE} (W_I): write it with `looplab retrofit`")
    from safetensors import safe_open

    try:
        with safe_open(injection, "pt") as handle:
            weight = handle.get_slice("weight") if "weight" in handle.keys() else None
            shape, dtype = (None, None) if weight is None else (weight.get_shape(), weight.get_dtype())
    except Exception:  # a truncated or foreign file: safetensors raises its own kinds
        shape, dtype = "unreadable", None
    if shape != [width, 2 * width]:
        raise LooplabError(f"{injection} must hold one tensor 'weight' of shape [{width}, {2 * width}], got {shape}")
    if dtype not in ("F32", "F16", "BF16", "F64"):  # an integer W_I would be cast to floats without a word
        raise LooplabError(f"{injection}: its weight is stored as {dtype}; W_I is a floating-point matrix")
    return split


def max_window(model_type: str, config) -> int:
    """The longest window: the model's positions, or its sliding attention window where a layer uses one
    (a retrofit's mask is full causal, exact only within the window)."""
    text = getattr(config, "text_config", None) or config
    window = int(getattr(text, "max_position_embeddings", None) or 2**31)
    if model_type in RETROFIT_SOURCES:
        sliding = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None)
        if isinstance(sliding, int) and (types is None or "sliding_attention" in types):
            window = min(window, sliding)
    return window


#: the config.json fields of the families transformers builds (HRM-Text, Inkling-2, the retrofit sources) that
#: every one of them reads, with their types and domains; a family's own fields are its config class's
TRANSFORMERS_FIELDS = {
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"), integer(optional=True)),
    **dict.fromkeys(("num_key_value_heads", "head_dim"), integer(optional=True)),
    **dict.fromkeys(("rms_norm_eps", "rope_theta"), positive_number()),
    "tie_word_embeddings": boolean(),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), token_ids()),
}  # fmt: skip


def open_model_dir(path: str | Path, tokenizer: str | Path | None = None) -> ModelDir:
    """Open a model directory without reading its weights (see the module docstring); one-line errors.
    ``tokenizer``: the folder holding the tokenizer, where the dir has none beside its weights (Parcae's)."""
    path = Path(path)
    tokenizer = None if tokenizer is None else Path(tokenizer)
    if not path.exists():
        raise LooplabError(f"model dir not found: {path}")
    if not path.is_dir():
        raise LooplabError(f"{path} is a file, not a model dir (a directory holding config.json)")
    if not (path / CONFIG_FILE).is_file():
        raise LooplabError(f"{path} is not a model dir (no {CONFIG_FILE}, as save_pretrained writes it)")
    if (path / "config.toml").is_file():
        raise LooplabError(
            f"{path} holds both {CONFIG_FILE} (a model dir) and config.toml (a looplab run dir): keep the one it is"
        )
    raw = read_config_json(path)
    model_type = raw["model_type"]
    if model_type not in LOOPED_FAMILIES and model_type not in RETROFIT_SOURCES:
        raise LooplabError(f"{path} holds model_type {model_type!r}, which looplab does not loop; {supported_models()}")
    family = LOOPED_FAMILIES.get(model_type)
    check_files(path, family is not None and family.model is not None, tokenizer)
    stay_offline()
    import transformers

    if family is not None and family.config_reader is not None:  # looplab builds it: its own config reader
        config = family.config_reader(raw, f"{path}/{CONFIG_FILE}")
    else:  # transformers' config class reads it: the fields every such family shares, checked first
        check_fields(raw, TRANSFORMERS_FIELDS, f"{path}/{CONFIG_FILE}")
        try:
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        except Exception as err:  # a config transformers cannot build: one line with its reason
            first = one_line(err)
            raise LooplabError(f"{path}/{CONFIG_FILE} is not a valid {model_type} config: {first}") from None
    text = getattr(config, "text_config", None) or config
    width = int(text.hidden_size)
    heads = max(int(getattr(text, key, 0) or 0) for key in ("num_attention_heads", "swa_num_attention_heads"))
    if family is not None:
        builder = family.model or getattr(transformers, family.model_types[model_type])
        meta = _built(builder, config, path)
        kind, layers, split, native = "native", None, None, int(family.native_loops(config))
        if native < 1:
            raise LooplabError(
                f"{path}/{CONFIG_FILE}: the model runs {native} loops by itself ({family.name}: {family.one_loop}); "
                "its loop count must be ≥ 1"
            )
    else:
        model_class, layer_class = RETROFIT_SOURCES[model_type]
        meta = _built(getattr(transformers, model_class), config, path)
        found = sorted({type(layer).__name__ for layer in getattr(getattr(meta, "model", None), "layers", [])})
        if found != [layer_class]:
            raise LooplabError(
                f"{path}: a {model_type} retrofit needs model.model.layers of {layer_class}, found {found or 'none'}"
            )
        layers = len(meta.model.layers)
        if (path / RETROFIT_FILE).exists() and not (path / RETROFIT_FILE).is_file():
            raise LooplabError(f"{path / RETROFIT_FILE} is not a file (a retrofit's split is a JSON file)")
        retrofit = (path / RETROFIT_FILE).is_file()
        kind = "retrofit" if retrofit else "source"
        split = _read_split(path, layers, width) if retrofit else None
        native = 1
    parameters = sum(p.numel() for p in meta.parameters())
    linears = tuple(name for name, module in meta.named_modules() if isinstance(module, nn.Linear))
    if kind == "retrofit":
        linears += ("inject",)  # the retrofit's W_I, a layer of the looped model beside the source's
    del meta
    tokenizer = load_tokenizer(tokenizer or path)
    window = max_window(model_type, config)
    return ModelDir(
        path, kind, model_type, config, tokenizer, parameters, layers, split, native, window, heads, width,
        linear_names=linears,
    )  # fmt: skip
