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

from looplab.generation.cache import LayerCache, RingLayerCache, Slots, SlotStore
from looplab.generation.cached_attention import cached_heads, output, project
from looplab.model.layer import Layer

__all__ = ["Calls", "Fused", "chain_layer", "prelude_pass", "core_pass", "fused_core_pass", "coda_pass", "logits_of"]


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

    def heads(self, index: int, attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Layer call ``index``'s attention heads [R, m, H·Dh] for the new tokens' projections q, k, v (before
        RoPE), after writing their keys and values (:func:`~looplab.generation.cached_attention.cached_heads`)."""
        entry = self.entry(index)
        return cached_heads(attn, q, k, v, self.rows, self.chunk, entry, self.allowed, self.rope, self.loop, self.keep)

    def layer(self, index: int, layer: Layer, x: Tensor) -> Tensor:
        """Layer call ``index`` on new tokens x [R, m, d]: a pre-norm layer (``attn_residual``, ``mlp_residual``)
        whose attention reads and extends its cache entry."""
        return chain_layer(self, index, layer, x)


def chain_layer(calls, index: int, layer: Layer, x: Tensor) -> Tensor:
    """Layer call ``index`` of ``calls`` (which gives its attention heads: ``calls.heads``) on new tokens x
    [R, m, d] of a layer of two residual sublayers (``attn_residual``, ``mlp_residual``)."""

    def attend(y: Tensor) -> Tensor:
        return output(layer.attn, calls.heads(index, layer.attn, *project(layer.attn, y)), y)

    return layer.mlp_residual(layer.attn_residual(x, attend), layer.mlp)


@dataclass
class Fused:
    """The layer calls of several parts of one loop run as one: part i's new tokens [R_i, m_i] (``shapes``) laid
    end to end as x [1, Σ R_i·m_i, d], so that each weight is read once for all of them (a decode step's few
    tokens and a prompt's, where a matrix product's time hardly grows with its rows). Each part's attention
    writes and reads its own cache entries through its own calls (``parts``: each has ``heads``), in the order
    given: a part reads what an earlier one wrote in the same layer call."""

    parts: list
    shapes: list[tuple[int, int]]

    def heads(self, index: int, attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Every part's heads [1, N, H·Dh] from the projections of all the tokens (q [1, H, N, Dh], k, v)."""
        out, start = [], 0
        for part, (count, width) in zip(self.parts, self.shapes):
            span = slice(start, start + count * width)
            start = span.stop
            own = (t[0, :, span].unflatten(1, (count, width)).transpose(0, 1) for t in (q, k, v))
            out.append(part.heads(index, attn, *own).reshape(1, count * width, -1))
        return torch.cat(out, 1)

    def layer(self, index: int, layer: Layer, x: Tensor) -> Tensor:
        return chain_layer(self, index, layer, x)


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


def fused_core_pass(model, parts: list[tuple[Tensor, Tensor, Any]]) -> list[Tensor]:
    """One loop of several parts' new tokens, each (h [R_i, m_i, d_h], e [R_i, m_i, d_e], calls_i), as one
    :func:`core_pass` through :class:`Fused` calls (a view whose core runs as a chain of layers, one token's
    states at a time: ``Capabilities.chains``); each part's states after it, [R_i, m_i, d_h]."""
    if len(parts) == 1:
        return [core_pass(model, *parts[0])]
    shapes = [tuple(h.shape[:2]) for h, _, _ in parts]

    def laid(tensors) -> Tensor:
        return torch.cat([t.reshape(1, -1, t.shape[-1]) for t in tensors], 1)

    fused = Fused([calls for _, _, calls in parts], shapes)
    x = core_pass(model, laid(h for h, _, _ in parts), laid(e for _, e, _ in parts), fused)[0]
    return [y.view(count, width, -1) for y, (count, width) in zip(x.split([r * m for r, m in shapes]), shapes)]


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
