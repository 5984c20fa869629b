"""Retrofit a pretrained Llama-architecture LM into a looped (p, k⊗r, c) model (docs/methods.md §7).

From a transformers causal LM with decoder layers 0..L−1 (``model.model.layers``):

    prelude = layers[0 : p]                     run once
    core    = layers[p : p + k]                 looped r times, weights shared across loops
    middle  = layers[p + k : L − c]             dropped (default) or, with keep_middle=True,
                                                run once after the loop, before the coda
    coda    = layers[L − c : L]                 run once
    norm, lm_head                               the original final norm and output head

    e   = prelude(embed(tokens))                the injected input
    h_0 = e
    h_t = core(W_I [e; h_{t−1}])                t = 1..r,  W_I ∈ R^{d×2d}
    logits = lm_head(norm(coda(middle(h_r))))

W_I starts as ``inject_init`` (see :func:`looplab.model.looped.injection_weight`):

    state   [0 | I]       the default: W_I [e; h] = h, so the input is ignored after loop 1 —
                          until fine-tuning changes W_I this is a model WITHOUT injection
    mix     [I/2 | I/2]   (e + h)/2: injects the input at every loop
    input   [I | 0]       every loop sees only e: h_t = core(e) for all t (no recurrence)
    sum     [I | I]       e + h; loop 1 sees 2e
    random  N(0, g²/d)    a fresh adapter

With h_0 = e, ``state``, ``mix`` and ``input`` give W_I [e; h_0] = e, so with r = 1 the
retrofit runs exactly layers 0..p+k−1, (the middle,) and the coda: with p + k + c = L (or
keep_middle=True) its logits equal the original model's. ``sum`` and ``random`` change the
first loop's input, so they do not. Fine-tuning with r > 1 then teaches W_I and the layers
to use the loop. The paper's retrofits used (p, k, c) = (4, 6, 4) on a Llama with
32 train loops; for SmolLM2-135M (30 layers) the defaults are the same (4, 6, 4), which
drop the 16 middle layers (layers 10..25) — the looped core takes over their depth.

Attention: the decoder layers are called directly with rotary ``position_embeddings``
from ``model.model.rotary_emb`` and an additive causal + key-padding mask built here
(each query may always see itself, so padded query rows stay finite). Recording
attention probabilities needs eager attention; the copied layers are switched to it.

The model implements the looped-model protocol (``looplab.model.protocol``), so
:func:`looplab.model.trace.trace` (and :meth:`RetrofittedLoop.record`, which calls
it) records it with the same names as looplab's own models (``prelude0.resid``,
``loop03.core1.resid``, ``loop03.core1.attn``, ``loop03.state``, ``coda0.resid``, …),
and :mod:`looplab.analysis.fixed_points`, :mod:`~looplab.analysis.colsum` and
:mod:`~looplab.analysis.massive` apply unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.model.depths import ReadAtDepths
from looplab.model.looped import injection_weight
from looplab.model.protocol import AttentionWatch, ObservedLayers
from looplab.model.trace import Trace, trace

__all__ = ["RetrofittedLoop", "LayerContext", "causal_mask", "watch_decoder_attention"]


@contextmanager
def watch_decoder_attention(layer: nn.Module, attention: nn.Module | None = None) -> Iterator[AttentionWatch]:
    """Record a transformers decoder layer's attention input (the ``hidden_states`` its ``self_attn`` is
    called with: after the layer's norm, for separate query / key / value inputs the query's) and its eager
    attention probabilities, one entry per call; ``attention``: the layer's attention module where it is not
    ``self_attn``."""
    attention = layer.self_attn if attention is None else attention
    seen = AttentionWatch()

    def before(_module, args, kwargs):
        seen.inputs.append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])

    def after(_module, _args, output):
        if output[1] is None:
            raise LooplabError("the attention returned no probabilities (eager attention is required)")
        seen.probs.append(output[1])

    handles = [
        attention.register_forward_pre_hook(before, with_kwargs=True),
        attention.register_forward_hook(after),
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def causal_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive mask [B, 1, T, T] for eager attention: 0 where key j ≤ query i and key j is valid
    (or j = i), the dtype's minimum elsewhere."""
    length = attention_mask.shape[-1]
    positions = torch.arange(length, device=attention_mask.device)
    allowed = (positions[None, :] <= positions[:, None])[None] & attention_mask.bool()[:, None, :]
    allowed = allowed | torch.eye(length, dtype=torch.bool, device=attention_mask.device)[None]
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


@dataclass
class LayerContext:
    """What every layer call of one batch shares: rotary ``rope`` (cos, sin), the additive ``mask``
    [B, 1, T, T] and ``valid`` [B, T] bool (a retrofit's, Ouro's and Huginn's context)."""

    rope: tuple[Tensor, Tensor]
    mask: Tensor
    valid: Tensor | None = None

    def select(self, rows: Tensor | slice) -> LayerContext:
        """The context restricted to some rows of the batch (an index tensor, boolean mask or slice)."""
        return replace(self, mask=self.mask[rows], valid=None if self.valid is None else self.valid[rows])


class RetrofittedLoop(ReadAtDepths, ObservedLayers, nn.Module):
    """A pretrained causal LM split into prelude, a looped core and a coda, with concat input injection.

    It implements the looped-model protocol (``looplab.model.protocol``): ``start`` / ``step`` /
    ``readout`` / ``context`` / ``observe`` / ``watch_attention``, so looplab's trace and analyses run
    on it unchanged, and so do the schedules' training objectives (``forward_at_depths``).

    Args:
        model: a transformers Llama-architecture causal LM (``model.model.layers``,
            ``model.model.embed_tokens``, ``model.model.rotary_emb``, ``model.model.norm``,
            ``model.lm_head``).
        prelude, core, coda: p, k, c layer counts (p + k + c ≤ L).
        keep_middle: run the layers between core and coda once after the loop
            (default: drop them).
        copy_weights: work on a deep copy (default), so fine-tuning leaves ``model`` intact;
            tied embedding / head weights stay tied in the copy.
        inject_init, inject_gain: the initial W_I (see the module docstring); the gain is for ``random``,
            drawn from torch's global generator.
    """

    def __init__(
        self,
        model: nn.Module,
        prelude: int = 4,
        core: int = 6,
        coda: int = 4,
        *,
        keep_middle: bool = False,
        copy_weights: bool = True,
        inject_init: str = "state",
        inject_gain: float = 0.25,
    ):
        super().__init__()
        try:
            n_layers = len(model.model.layers)
        except AttributeError as exc:
            raise LooplabError(f"{type(model).__name__} is not a Llama-architecture causal LM") from exc
        if min(prelude, coda) < 0 or core < 1 or prelude + core + coda > n_layers:
            raise LooplabError(
                f"retrofit needs p ≥ 0, k ≥ 1, c ≥ 0 and p + k + c ≤ {n_layers} layers; "
                f"got (p, k, c) = ({prelude}, {core}, {coda})"
            )
        parts = nn.ModuleDict(
            {
                "embed": model.model.embed_tokens,
                "rotary": model.model.rotary_emb,
                "norm": model.model.norm,
                "head": model.lm_head,
                "layers": model.model.layers,
            }
        )
        if copy_weights:
            parts = copy.deepcopy(parts)  # one deepcopy: shared (tied) parameters stay shared
        layers = list(parts["layers"])
        self.config = copy.deepcopy(model.config)
        self.config._attn_implementation = "eager"
        self.embed, self.rotary, self.norm, self.lm_head = parts["embed"], parts["rotary"], parts["norm"], parts["head"]
        self.prelude = nn.ModuleList(layers[:prelude])
        self.core = nn.ModuleList(layers[prelude : prelude + core])
        self.middle = nn.ModuleList(layers[prelude + core : n_layers - coda] if keep_middle else [])
        self.coda = nn.ModuleList(layers[n_layers - coda :])
        for layer in layers:
            if hasattr(layer, "self_attn"):
                layer.self_attn.config = self.config
        self.n_layers, self.p, self.k, self.c, self.keep_middle = n_layers, prelude, core, coda, keep_middle
        d = self.embed.weight.shape[1]
        self.inject = nn.Linear(2 * d, d, bias=False, dtype=self.embed.weight.dtype, device=self.embed.weight.device)
        with torch.no_grad():
            self.inject.weight.copy_(
                injection_weight(inject_init, d, inject_gain, self.inject.weight.dtype, self.inject.weight.device)
            )

    # ------------------------------------------------------------------ the looped-model protocol

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, LayerContext]:
        """(h_0, e, ctx): the prelude output e [B, T, d] is both the injected input and h_0."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embed(input_ids)
        ctx = self.context(attention_mask)
        for index, layer in enumerate(self.prelude):
            x = self._call("prelude", index, layer, x, ctx)
        return x, x, ctx

    def context(self, valid: Tensor) -> LayerContext:
        """The context of a batch from its validity mask [B, T] (bool, or the 0/1 attention mask) alone."""
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        positions = torch.arange(valid.shape[1], device=device)[None]
        # the rotary tables take their dtype and device from x, nothing else of it
        rope = self.rotary(torch.zeros((), dtype=dtype, device=device), position_ids=positions)
        return LayerContext(rope, causal_mask(valid, dtype), valid.bool())

    def step(self, h: Tensor, e: Tensor, ctx: LayerContext) -> Tensor:
        """One loop: h_t = core(W_I [e; h_{t−1}])."""
        x = self.inject(torch.cat([e, h], dim=-1))
        for index, layer in enumerate(self.core):
            x = self._call("core", index, layer, x, ctx)
        return x

    def readout(self, h: Tensor, ctx: LayerContext, at: Tensor | None = None) -> Tensor:
        """Logits [B, T, V] from the last core state (middle, coda, final norm, head); with ``at``
        ([B, T] bool) only at those positions, [N, V] — the head is the costliest matmul here."""
        for index, layer in enumerate(self.middle):
            h = self._call("middle", index, layer, h, ctx)
        for index, layer in enumerate(self.coda):
            h = self._call("coda", index, layer, h, ctx)
        return self.lm_head(self.norm(h if at is None else h[at]))

    def watch_attention(self, layer: nn.Module):
        """Record a decoder layer's attention input (after its RMSNorm) and eager attention probabilities."""
        return watch_decoder_attention(layer)

    def _call(self, site: str, index: int, layer: nn.Module, x: Tensor, ctx: LayerContext) -> Tensor:
        def run(y: Tensor) -> Tensor:
            out = layer(y, attention_mask=ctx.mask, position_embeddings=ctx.rope, use_cache=False)
            return out[0] if isinstance(out, tuple) else out

        return run(x) if self._layer_hook is None else self._run(site, index, layer, x, run)

    # ------------------------------------------------------------------ API

    def unroll(self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int = 1) -> Iterator[Tensor]:
        """Yield h_1 … h_r, the core state after each loop ([B, T, d])."""
        h, e, ctx = self.start(input_ids, attention_mask)
        for _ in range(loops):
            h = self.step(h, e, ctx)
            yield h

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int = 1) -> Tensor:
        """Logits [B, T, V] after ``loops`` loops of the core."""
        if loops < 1:
            raise LooplabError(f"loops must be ≥ 1, got {loops}")
        h, e, ctx = self.start(input_ids, attention_mask)
        for _ in range(loops):
            h = self.step(h, e, ctx)
        return self.readout(h, ctx)

    def record(self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int = 1, **options) -> Trace:
        """A looplab :class:`Trace` of one forward pass: :func:`looplab.model.trace.trace` on this model
        (names ``preludeI.resid``, ``loopTT.coreL.resid``, ``loopTT.coreL.attn``, ``loopTT.state``,
        ``middleI.resid``, ``codaI.resid``, …; ``options`` as for ``trace``, attention on by default)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        options.setdefault("attention", True)
        try:
            return trace(self, input_ids, attention_mask.bool(), loops, **options)
        except ValueError as err:  # an out-of-range layer or loop index
            raise LooplabError(str(err)) from None
