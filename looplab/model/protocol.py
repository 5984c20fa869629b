"""The looped-model protocol: what trace, analysis and evaluation code asks of a model.

Both :class:`looplab.model.LoopedTransformer` and a pretrained model wrapped into
a loop (:class:`looplab.lm.retrofit.RetrofittedLoop`) provide:

    start(tokens, valid, generator=None) -> (h_0, e, ctx)   the initial state, the injected input [B, L, d]
                                                              and the model's context (masks, positions)
    step(h, e, ctx) -> h                                     one loop
    readout(h, ctx, at=None) -> logits [B, L, V]             everything after the loop; with ``at``
                                                              [B, L] bool, [N, V] at those positions
    context(valid) -> ctx                                    the context of a batch from its validity
                                                              mask [B, L] alone; ``ctx.select(rows)``
                                                              restricts it to some rows
    observe(hook)                                            a block in which every layer call goes
                                                              through hook(site, index, layer, x, run)
    watch_attention(layer)                                   a block that records the layer's attention
                                                              input and probabilities
    prelude, core, coda                                      the layers, as sequences

so one trace (``looplab.model.trace``) records either, with the same names, and the
schedules' training objectives (``looplab.model.depths``) train either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

#: hook(site, index, layer, x, run) -> the layer's output, where run(x) calls the layer in its context;
#: site is "prelude", "core", "middle" (a retrofit's kept middle layers) or "coda"
LayerHook = Callable[[str, int, nn.Module, Tensor, Callable[[Tensor], Tensor]], Tensor]


@dataclass
class AttentionWatch:
    """What :meth:`LoopedModel.watch_attention` records, one entry per call of the watched layer.

    Attributes:
        inputs: [B, L, d] the attention sublayer's input (after its norm, for pre-norm layers).
        probs: [B, H, L, L] its attention probabilities.
    """

    inputs: list[Tensor] = field(default_factory=list)
    probs: list[Tensor] = field(default_factory=list)


class LoopedModel(Protocol):
    prelude: nn.ModuleList
    core: nn.ModuleList
    coda: nn.ModuleList

    def start(self, tokens: Tensor, valid: Tensor, generator: torch.Generator | None = None) -> tuple: ...

    def step(self, h: Tensor, e: Tensor, ctx: Any) -> Tensor: ...

    def readout(self, h: Tensor, ctx: Any, at: Tensor | None = None) -> Tensor: ...

    def context(self, valid: Tensor) -> Any: ...

    def observe(self, hook: LayerHook): ...

    def watch_attention(self, layer: nn.Module): ...


@dataclass
class LoopProbe:
    """Where a one-loop regulariser looks: each row's state at its (last) supervised depth.

    Attributes:
        h: [B, L, d] the states, with gradient; e: [B, L, d] the injected input; valid: [B, L];
        ctx: the model's context for ``step`` (masks, positions) when the regulariser must run the
            loop in the context ``start`` returned; None: the context is built from ``valid``.
    """

    h: Tensor
    e: Tensor
    valid: Tensor
    ctx: Any = None


def readouts_by_loops(
    model: LoopedModel, tokens: Tensor, valid: Tensor, loops: int, at: Tensor | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """(h_t, logits) after each loop t = 1..loops of one unroll: logits [B, L, V], or [N, V] at the
    positions ``at`` [B, L] selects (row-major), which lets a pretrained model apply its head there alone."""
    h, e, ctx = model.start(tokens, valid)
    for _ in range(loops):
        h = model.step(h, e, ctx)
        yield h, model.readout(h, ctx, at=at)


def output_heads(model: nn.Module) -> tuple[nn.Module, ...]:
    """The modules a model's logits come from (``lm_head`` / ``head``, wherever they sit): what int8 weights and
    LoRA adapters leave as they are."""
    return tuple(module for name, module in model.named_modules() if name.split(".")[-1] in ("lm_head", "head"))


class ObservedLayers:
    """The layer hook of :meth:`LoopedModel.observe`, shared by the models that implement the protocol.

    A model calls :meth:`_run` for every layer, with a function that runs that layer in its context.
    """

    _layer_hook: LayerHook | None = None

    @contextmanager
    def observe(self, hook: LayerHook) -> Iterator[None]:
        """Route every layer call through ``hook`` inside the block (the hook runs the layer itself)."""
        if self._layer_hook is not None:
            raise RuntimeError("a layer hook is already installed")
        self._layer_hook = hook
        try:
            yield
        finally:
            self._layer_hook = None

    def _run(self, site: str, index: int, layer: nn.Module, x: Tensor, run: Callable[[Tensor], Tensor]) -> Tensor:
        return run(x) if self._layer_hook is None else self._layer_hook(site, index, layer, x, run)
