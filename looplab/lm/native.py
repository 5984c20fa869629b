"""What the adapters of native looped LMs share (:mod:`looplab.lm.hrm_text`, :mod:`looplab.lm.inkling2_loop`,
:mod:`looplab.lm.ouro`, :mod:`looplab.lm.huginn`; the registry is :mod:`looplab.lm.families`).

A native looped LM already has a loop of its own, so its adapter adds no parameters: it
calls the model's own layers, norms, rotary tables and mask builders in the order the
model's ``forward`` does, with the loop cut at its natural boundary, so that
``start``, ``step`` × K, ``readout`` gives the logits of the model's forward with the
config's loop count set to K. The adapter shares the wrapped model's modules (one copy
of the weights) unless ``copy_weights`` is set.

What this module gives them:

    NativeLoop          ``forward`` / ``unroll`` (K defaults to the config's ``native_loops``),
                        ``watch_attention`` for transformers' attention modules, and the
                        checks ``from_pretrained_model`` runs
    ModelFamily         the record of a family: its classes, adapter, decoding view, loops
    prepare_model       the copy (optional) and the attention kernel the adapter runs
    select_rows         a context tensor restricted to some rows of the batch
    DecodingShape       the model facts a decoding view gives the cached decoder
    LlamaLayerView, Olmo2LayerView, layer_view
                        a Llama-family decoder layer as the decoder's two residual sublayers
    rotary_tables       a transformers rotary module's tables in the form the decoder applies
    pair_rope_tables    RoPE tables of adjacent pairs (Huginn's, Parcae's), for de-interleaved heads
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.retrofit import watch_decoder_attention
from looplab.model.depths import ReadAtDepths
from looplab.model.protocol import ObservedLayers

__all__ = [
    "DecodingShape",
    "LlamaLayerView",
    "ModelFamily",
    "NativeLoop",
    "pair_rope_tables",
    "prepare_model",
    "rotary_tables",
    "select_rows",
]


def prepare_model(model: nn.Module, copy_weights: bool, attn_implementation: str | None) -> nn.Module:
    """The model the adapter wraps: ``model`` itself (or a deep copy) switched to ``attn_implementation``.

    The switch goes through transformers' ``set_attn_implementation``, so without a copy the
    wrapped model's own forward uses that kernel too (its layers are the adapter's).
    """
    if copy_weights:
        model = copy.deepcopy(model)
    if attn_implementation is not None and model.config._attn_implementation != attn_implementation:
        model.set_attn_implementation(attn_implementation)
    return model


def select_rows(x: Tensor | None, rows: Tensor | slice) -> Tensor | None:
    """``x[rows]`` along the batch for a per-row tensor; None, or a tensor broadcast over the batch, as it is."""
    return x if x is None or x.shape[0] == 1 else x[rows]


class NativeLoop(ReadAtDepths, ObservedLayers, nn.Module):
    """Base of the native-loop adapters: the loop-count API and the attention watch.

    A subclass sets ``model_types`` (the transformers ``model_type`` values it wraps) and
    ``native_loops`` (the loop count of the wrapped config), and implements the protocol's
    ``start`` / ``step`` / ``readout`` / ``context``.
    """

    model_types: tuple[str, ...] = ()
    native_loops: int

    @classmethod
    def from_pretrained_model(cls, model: nn.Module, **options) -> NativeLoop:
        """The adapter of a loaded transformers model of this family (``options`` as for the constructor)."""
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in cls.model_types:
            raise LooplabError(
                f"{cls.__name__} wraps model_type {' or '.join(map(repr, cls.model_types))}, got {model_type!r}"
            )
        return cls(model, **options)

    def unroll(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int | None = None
    ) -> Iterator[Tensor]:
        """Yield h_1 … h_K, the loop state after each loop (K defaults to ``native_loops``)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        h, e, ctx = self.start(input_ids, attention_mask)
        for _ in range(self._loops(loops)):
            h = self.step(h, e, ctx)
            yield h

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int | None = None) -> Tensor:
        """Logits [B, T, V] after ``loops`` loops (default ``native_loops``: transformers' own forward)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        h, e, ctx = self.start(input_ids, attention_mask)
        for _ in range(self._loops(loops)):
            h = self.step(h, e, ctx)
        return self.readout(h, ctx)

    def _loops(self, loops: int | None) -> int:
        loops = self.native_loops if loops is None else loops
        if loops < 1:
            raise LooplabError(f"loops must be ≥ 1, got {loops}")
        return loops

    def watch_attention(self, layer: nn.Module):
        """Record a decoder layer's attention input (its ``hidden_states``, after the layer's norm: for a
        layer with separate query / key / value inputs, the query's) and its eager attention probabilities."""
        return watch_decoder_attention(layer)


@dataclass(frozen=True)
class DecodingShape:
    """The model facts the decoder checks and sizes its caches by (the fields of a looplab model config it
    reads), for a pretrained model's decoding view."""

    n_heads: int
    kv_heads: int
    d_model: int
    head_dim: int
    coda_layers: int
    max_len: int
    causal: bool = True
    init_state: str = "embed"  # h_0 = e
    injection: str = "concat"
    positional: str = "rope"
    attention_window: int = 0
    recurrence: str = "standard"  # one carried state, as the decoder requires


def rotary_tables(rotary: nn.Module, width: int, length: int, device, dtype) -> tuple[Tensor, Tensor]:
    """A transformers rotary module's (cos, signed sin) tables [L, Dh] for positions 0..L−1, in the form
    :func:`looplab.model.attention.apply_rope` takes (rotate-half's sign folded into the first half of sin)."""
    probe = torch.zeros(1, length, width, device=device, dtype=dtype)
    cos, sin = rotary(probe, position_ids=torch.arange(length, device=device)[None])
    half = sin.shape[-1] // 2
    return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)


def pair_rope_tables(dim: int, base: float, length: int, device, condense: float = 1) -> tuple[Tensor, Tensor]:
    """(cos, signed sin) [length, dim] in float32 of a RoPE that rotates adjacent pairs (x_2i, x_2i+1) at
    frequencies base^(−2i/dim), positions divided by ``condense``; for heads de-interleaved, so the decoder
    applies them as rotate-half (:func:`looplab.model.attention.apply_rope`)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32) / condense, inv_freq)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], -1).to(device), torch.cat([-sin, sin], -1).to(device)


class LlamaLayerView:
    """A Llama decoder layer as two pre-norm residual sublayers: x + attn(norm₁ x), then x + mlp(norm₂ x)."""

    def __init__(self, layer: nn.Module):
        self.layer, self.attn, self.mlp = layer, layer.self_attn, layer.mlp

    def attn_residual(self, x: Tensor, attend) -> Tensor:
        return x + attend(self.layer.input_layernorm(x))

    def mlp_residual(self, x: Tensor, mlp) -> Tensor:
        return x + mlp(self.layer.post_attention_layernorm(x))


class Olmo2LayerView(LlamaLayerView):
    """An OLMo-2 decoder layer: its norms sit after the sublayers, x + norm₁(attn(x)), then x + norm₂(mlp(x))."""

    def attn_residual(self, x: Tensor, attend) -> Tensor:
        return x + self.layer.post_attention_layernorm(attend(x))

    def mlp_residual(self, x: Tensor, mlp) -> Tensor:
        return x + self.layer.post_feedforward_layernorm(mlp(x))


def layer_view(layer: nn.Module) -> LlamaLayerView:
    """The residual view of a Llama-family decoder layer: post-norm where it has OLMo-2's norms, else pre-norm."""
    return Olmo2LayerView(layer) if hasattr(layer, "post_feedforward_layernorm") else LlamaLayerView(layer)


@dataclass(frozen=True)
class ModelFamily:
    """One family of looped LM, everything a tool needs to open, loop, decode and describe it
    (the registry is :data:`looplab.lm.families.FAMILIES`; each family's module ends with its record).

    Attributes:
        name: how docs and messages name it.
        model_types: config.json's ``model_type`` → the transformers class that builds it, or None where
            looplab builds it itself (``config_reader`` and ``model``: families transformers does not have).
        adapter: the :class:`NativeLoop` subclass that puts the loaded model on the looped-model protocol.
        view: the decoding view class (the adapter in the shape the cached decoder reads).
        native_loops: config → the loop count the model runs by itself.
        one_loop: what one loop is, in a few words.
        core_layers: config → the layer calls a trace records per loop.
        state_width: config → an upper bound of the loop state's width per token (memory estimates).
        config_reader: (config.json as a dict, where) → config, for a family looplab builds.
        model: the model class looplab builds, with ``from_dir(path, config, dtype, device)``.
        exit_defaults: config → the generation exits' parameters the config sets (``[generate.exits.NAME]``).
        config_class_names: config.json's ``_class_name`` values naming this family, for checkpoints whose
            config.json holds no ``model_type`` (Parcae's); the first model_type stands for it.
    """

    name: str
    model_types: dict[str, str | None]
    adapter: type
    view: type
    native_loops: Callable[[Any], int]
    one_loop: str
    core_layers: Callable[[Any], int]
    state_width: Callable[[Any], int]
    config_reader: Callable[[dict, str], Any] | None = None
    model: type | None = None
    exit_defaults: Callable[[Any], dict[str, dict]] | None = None
    config_class_names: tuple[str, ...] = ()
