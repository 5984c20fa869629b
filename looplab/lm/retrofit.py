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

:meth:`RetrofittedLoop.record` returns a :class:`looplab.analysis.trace.Trace` with the
same names as looplab's own traces (``prelude0.resid``, ``loop03.core1.resid``,
``loop03.core1.attn``, ``loop03.state``, ``coda0.resid``, …), so
:mod:`looplab.analysis.fixed_points`, :mod:`~looplab.analysis.colsum` and
:mod:`~looplab.analysis.massive` apply unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from looplab.analysis.trace import Trace, loop_name
from looplab.errors import LooplabError
from looplab.model.looped import injection_weight

__all__ = ["RetrofittedLoop", "causal_mask"]


def causal_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive mask [B, 1, T, T] for eager attention: 0 where key j ≤ query i and key j is valid
    (or j = i), the dtype's minimum elsewhere."""
    length = attention_mask.shape[-1]
    positions = torch.arange(length, device=attention_mask.device)
    allowed = (positions[None, :] <= positions[:, None])[None] & attention_mask.bool()[:, None, :]
    allowed = allowed | torch.eye(length, dtype=torch.bool, device=attention_mask.device)[None]
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


class RetrofittedLoop(nn.Module):
    """A pretrained causal LM split into prelude, a looped core and a coda, with concat input injection.

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

    # ------------------------------------------------------------------ pieces

    def _context(self, input_ids: Tensor, attention_mask: Tensor | None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embed(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        rope = self.rotary(x, position_ids=positions)
        return x, rope, causal_mask(attention_mask, x.dtype), attention_mask

    @staticmethod
    def _layer(layer: nn.Module, x: Tensor, rope, mask: Tensor) -> Tensor:
        out = layer(x, attention_mask=mask, position_embeddings=rope, use_cache=False)
        return out[0] if isinstance(out, tuple) else out

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None):
        """(e, rope, mask, attention_mask): the prelude output e [B, T, d] and the attention context."""
        x, rope, mask, attention_mask = self._context(input_ids, attention_mask)
        for layer in self.prelude:
            x = self._layer(layer, x, rope, mask)
        return x, rope, mask, attention_mask

    def step(self, h: Tensor, e: Tensor, rope, mask: Tensor) -> Tensor:
        """One loop: h_t = core(W_I [e; h_{t−1}])."""
        x = self.inject(torch.cat([e, h], dim=-1))
        for layer in self.core:
            x = self._layer(layer, x, rope, mask)
        return x

    def readout(self, h: Tensor, rope, mask: Tensor, at: Tensor | None = None) -> Tensor:
        """Logits [B, T, V] from the last core state (middle, coda, final norm, head); with ``at``
        ([B, T] bool) only at those positions, [N, V] — the head is the costliest matmul here."""
        for layer in [*self.middle, *self.coda]:
            h = self._layer(layer, h, rope, mask)
        return self.lm_head(self.norm(h if at is None else h[at]))

    # ------------------------------------------------------------------ API

    def unroll(self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int = 1) -> Iterator[Tensor]:
        """Yield h_1 … h_r, the core state after each loop ([B, T, d])."""
        e, rope, mask, _ = self.encode(input_ids, attention_mask)
        h = e
        for _ in range(loops):
            h = self.step(h, e, rope, mask)
            yield h

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, loops: int = 1) -> Tensor:
        """Logits [B, T, V] after ``loops`` loops of the core."""
        if loops < 1:
            raise LooplabError(f"loops must be ≥ 1, got {loops}")
        e, rope, mask, _ = self.encode(input_ids, attention_mask)
        h = e
        for _ in range(loops):
            h = self.step(h, e, rope, mask)
        return self.readout(h, rope, mask)

    @torch.no_grad()
    def record(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        loops: int = 1,
        *,
        attention: bool = True,
        layers: list[int] | None = None,
        loop_indices: list[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> Trace:
        """A looplab :class:`Trace` of one forward pass (names as in :mod:`looplab.analysis.trace`).

        Records ``preludeI.resid``, ``loopTT.coreL.resid`` (X_{L,t}), ``loopTT.state`` (h_t,
        ``loop00.state`` = h_0 = e), ``middleI.resid`` and ``codaI.resid``; with
        ``attention`` also the ``.attn`` probabilities [B, H, T, T] and the core layers'
        ``.attn_in`` (input of the attention, after its RMSNorm). Core entries only for the
        selected core ``layers`` and ``loop_indices`` (default: all); everything is detached
        and stored on ``device`` in ``dtype``.
        """
        layers = sorted(set(range(self.k) if layers is None else layers))
        if any(not 0 <= layer < self.k for layer in layers):
            raise LooplabError(f"core layer indices must lie in 0..{self.k - 1}, got {layers}")
        wanted = set(range(loops + 1) if loop_indices is None else loop_indices)
        if any(not 0 <= t <= loops for t in wanted):
            raise LooplabError(f"loop indices must lie in 0..{loops}")
        x, rope, mask, attention_mask = self._context(input_ids, attention_mask)
        out = Trace(
            valid=attention_mask.bool().detach().to(device),
            loops=sorted(t for t in wanted if t >= 1),
            layers=layers,
            total_loops=loops,
            n_prelude=self.p,
            n_coda=self.c,
            has_attention=attention,
        )

        def keep(name: str, value: Tensor) -> None:
            if name in out.cache:
                raise RuntimeError(f"duplicate trace name {name}")
            out.cache[name] = value.detach().to(device=device, dtype=dtype)

        def run(layer: nn.Module, x: Tensor, prefix: str, record: bool) -> Tensor:
            if not record:
                return self._layer(layer, x, rope, mask)
            if not attention:
                x = self._layer(layer, x, rope, mask)
                keep(f"{prefix}.resid", x)
                return x
            grabbed: dict[str, Tensor] = {}

            def pre(_module, args, kwargs):
                grabbed["in"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

            def post(_module, _args, output):
                grabbed["probs"] = output[1]

            handles = [
                layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True),
                layer.self_attn.register_forward_hook(post),
            ]
            try:
                x = self._layer(layer, x, rope, mask)
            finally:
                for handle in handles:
                    handle.remove()
            if grabbed.get("probs") is None:
                raise LooplabError("the attention returned no probabilities (eager attention is required)")
            keep(f"{prefix}.resid", x)
            keep(f"{prefix}.attn", grabbed["probs"])
            keep(f"{prefix}.attn_in", grabbed["in"])
            return x

        for i, layer in enumerate(self.prelude):
            x = run(layer, x, f"prelude{i}", True)
        e = h = x
        if 0 in wanted:
            keep(f"{loop_name(0, loops)}.state", h)
        for t in range(1, loops + 1):
            prefix = loop_name(t, loops)
            x = self.inject(torch.cat([e, h], dim=-1))
            for index, layer in enumerate(self.core):
                x = run(layer, x, f"{prefix}.core{index}", t in wanted and index in layers)
            h = x
            if t in wanted:
                keep(f"{prefix}.state", h)
        for i, layer in enumerate(self.middle):
            h = run(layer, h, f"middle{i}", True)
        for i, layer in enumerate(self.coda):
            h = run(layer, h, f"coda{i}", True)
        return out
