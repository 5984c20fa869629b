"""What the adapters of transformers' native looped LMs share (:mod:`looplab.lm.hrm_text`,
:mod:`looplab.lm.inkling2_loop`; the registry is :mod:`looplab.lm.families`).

A native looped LM already has a loop of its own, so its adapter adds no parameters: it
calls transformers' own layers, norms, rotary tables and mask builders in the order the
model's ``forward`` does, with the loop cut at its natural boundary, so that
``start``, ``step`` × K, ``readout`` gives the logits of transformers' forward with the
config's loop count set to K. The adapter shares the wrapped model's modules (one copy
of the weights) unless ``copy_weights`` is set.

What this module gives them:

    NativeLoop          ``forward`` / ``unroll`` (K defaults to the config's ``native_loops``),
                        ``watch_attention`` for transformers' attention modules, and the
                        checks ``from_pretrained_model`` runs
    prepare_model       the copy (optional) and the attention kernel the adapter runs
    select_rows         a context tensor restricted to some rows of the batch
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.retrofit import watch_decoder_attention
from looplab.model.depths import ReadAtDepths
from looplab.model.protocol import ObservedLayers

__all__ = ["NativeLoop", "prepare_model", "select_rows"]


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
