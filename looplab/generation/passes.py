"""The passes of new tokens through a decoding view, each layer call reading and extending its KV cache entry
(:class:`Calls`): what every cached decoder runs.

What they read of a model (a looplab model as is; a retrofit or a native looped LM through its decoding view,
:func:`looplab.generation.views.decodable`): ``embedding``, ``positions``, ``cfg``, ``head`` and
``initial_state``, and three passes over new tokens, each calling every decoder layer through a
:class:`Calls` so that call ``index`` of a pass has its own cache entry:

    prelude_pass(x, calls) -> e         default: the ``prelude`` layers
    core_pass(h, e, calls) -> h'        one loop; default: core_input(h, e), the ``core`` layers, core_out_norm
    coda_pass(h, calls) -> h            default: the ``coda`` layers
    logits(h) -> [.., V]                default: head(final_norm(h))

A view whose loop is not a chain of layers (HRM-Text's L and H stacks, Inkling-2's message-gated
pass) overrides them; the defaults are what the looplab models and the retrofits ran before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from looplab.generation.cache import LayerCache, RingLayerCache, Slots, SlotStore, cached_attention
from looplab.model.layer import Layer

__all__ = ["Calls", "prelude_pass", "core_pass", "coda_pass", "logits_of"]


@dataclass
class Calls:
    """The layer calls of one pass of new tokens — the tokens in slots ``chunk`` of ``rows`` (row indices,
    or ``slice(None)`` for every row), at ``site`` and core ``loop`` (0 outside the core) — as a decoding
    view's passes make them: :meth:`layer` runs a pre-norm layer with cached attention; a family that
    runs its own layer modules reads its entries with :meth:`entry` and :meth:`history`.

    ``allowed`` [R, m, chunk.stop] is :func:`~looplab.generation.cache.visible`'s mask under the model's
    window, ``rope`` the new tokens' (cos, sin) [R, m, Dh] or None; ``keep`` [R] bool, when given, says
    which rows' keys and values are written (the others run, but their cache entries stay as they were).
    """

    decoder: Any  # the Decoder (looplab.generation.step, which imports this module) whose slots and cache it reads
    site: str
    loop: int
    rows: Tensor | slice
    chunk: slice
    allowed: Tensor
    rope: tuple[Tensor, Tensor] | None
    keep: Tensor | None = None

    @property
    def slots(self) -> Slots:
        return self.decoder.slots

    @property
    def positions(self) -> Tensor:
        """[R, m] long: the new tokens' positions in their own rows."""
        return self.decoder.slots.positions[self.rows, self.chunk]

    def entry(self, index: int, heads: int | None = None, head_dim: int | None = None) -> LayerCache | RingLayerCache:
        """The keys and values of layer call ``index`` of this pass (the model's shape unless given)."""
        return self.decoder.cache.layer(self.site, self.loop, index, heads, head_dim)

    def history(self, index: int, name, channels: int, dtype: torch.dtype | None = None) -> SlotStore:
        """The per-slot convolution inputs ``name`` of layer call ``index``."""
        return self.decoder.cache.history(self.site, self.loop, (index, name), channels, dtype)

    def layer(self, index: int, layer: Layer, x: Tensor) -> Tensor:
        """Layer call ``index`` on new tokens x [R, m, d]: a pre-norm layer (``attn_residual``, ``mlp_residual``)
        whose attention reads and extends its cache entry."""
        cache = self.entry(index)

        def attend(y: Tensor) -> Tensor:
            return cached_attention(
                layer.attn, y, self.rows, self.chunk, cache, self.allowed, self.rope, self.loop, self.keep
            )

        return layer.mlp_residual(layer.attn_residual(x, attend), layer.mlp)


def prelude_pass(model, x: Tensor, calls: Calls) -> Tensor:
    """e [R, m, d_e] of new tokens' embeddings x: the model's ``prelude_pass``, by default its prelude layers."""
    if "prelude" in model.capabilities.passes:
        return model.prelude_pass(x, calls)
    for index, layer in enumerate(model.prelude):
        x = calls.layer(index, layer, x)
    return x


def core_pass(model, h: Tensor, e: Tensor, calls: Calls) -> Tensor:
    """One loop on the new tokens' states h [R, m, d_h]: the model's ``core_pass``, by default
    core_input(h, e), the core layers and the core's output norm."""
    if "core" in model.capabilities.passes:
        return model.core_pass(h, e, calls)
    x = model.core_input(h, e)
    for index, layer in enumerate(model.core):
        x = calls.layer(index, layer, x)
    return x if model.core_out_norm is None else model.core_out_norm(x)


def coda_pass(model, h: Tensor, calls: Calls) -> Tensor:
    """The states after the loop through the model's ``coda_pass``, by default its coda layers."""
    if "coda" in model.capabilities.passes:
        return model.coda_pass(h, calls)
    for index, layer in enumerate(model.coda):
        h = calls.layer(index, layer, h)
    return h


def logits_of(model, h: Tensor) -> Tensor:
    """Next-token logits [..., V] of states h [..., d_h]: the model's ``logits``, by default head(final_norm(h))."""
    if "logits" in model.capabilities.passes:
        return model.logits(h)
    return model.head(model.final_norm(h))
