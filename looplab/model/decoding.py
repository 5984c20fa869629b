"""The decoding-view contract: what the cached decoder (:mod:`looplab.generation.step`) reads of a model,
and the capabilities a view declares instead of being probed for them.

A looplab model is its own view; a retrofit and each native looped LM have a view class of their own
(:func:`looplab.generation.views.decodable` picks it). Every view class declares :class:`Capabilities` as
its ``capabilities`` class attribute; ``tests/unit/test_decoding_views.py`` holds each declaration to the
methods the class has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from torch import Tensor, nn

__all__ = ["Capabilities", "DecodingView", "PASSES"]

#: the passes a view may run itself, each a method of its own: ``prelude_pass(x, calls)``,
#: ``core_pass(h, e, calls)``, ``coda_pass(h, calls)``, ``logits(h)``
PASSES = ("prelude", "core", "coda", "logits")


@dataclass(frozen=True)
class Capabilities:
    """What a decoding view offers beyond the default the decoder runs (the prelude, core and coda as chains of
    pre-norm layers; logits as head(final_norm(h)); RoPE tables from the config).

    Attributes:
        passes: those of :data:`PASSES` the view runs itself (a loop that is not a chain of layers: HRM-Text's
            two stacks, Inkling-2's message-gated pass, Huginn's coda, Ouro's gated core).
        rope: it has rotary tables of its own (``rope_tables(length, device, dtype)``: a pretrained model's).
        gated: its loop states carry a learned exit gate's decision (what the ``gate`` exit reads).
        gate: its family has a gated twin (the view class's ``with_gate(loop)``).
        policies: the KV cache policies it decodes through (None: every one).
        layerwise: the passes it runs itself reach the layers through ``calls.layer`` alone, one token's states
            at a time (Huginn's coda, Ouro's gated core), so the decoders that batch tokens at different loops
            take them as they take chains of layers.
    """

    passes: frozenset[str] = frozenset()
    rope: bool = False
    gated: bool = False
    gate: bool = False
    policies: tuple[str, ...] | None = None
    layerwise: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.passes) - set(PASSES)
        if unknown:
            raise ValueError(f"unknown passes {sorted(unknown)}; valid choices: {', '.join(PASSES)}")

    @property
    def chains(self) -> bool:
        """Whether its prelude, core and coda are chains of pre-norm layers, or passes of its own that run like
        them (``layerwise``): what depth-wise batching, wavefront decoding and masked decode steps run."""
        return self.layerwise or not self.passes & {"prelude", "core", "coda"}


class DecodingView(Protocol):
    """What the cached decoder reads of a model (shapes in :mod:`looplab.generation.passes`)."""

    capabilities: ClassVar[Capabilities]
    cfg: Any  # a looplab ModelConfig, or a family's DecodingShape
    embedding: nn.Module
    positions: nn.Embedding | None
    head: nn.Linear
    prelude: nn.ModuleList
    core: nn.ModuleList
    coda: nn.ModuleList
    core_out_norm: nn.Module | None
    final_norm: nn.Module

    def initial_state(self, e: Tensor) -> Tensor: ...

    def core_input(self, h: Tensor, e: Tensor) -> Tensor: ...
