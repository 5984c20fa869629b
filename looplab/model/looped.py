"""The looped (weight-tied, recurrent-depth) transformer of docs/methods.md §1.

    tokens ─► E(x) (+ learned positions) ─► prelude (p layers) ─► e
    h_0 = e | 0 | noise
    h_t = Core(inject(h_{t-1}, e))          t = 1..r, k shared layers (+ optional core_out_norm)
    logits_t = Head(FinalNorm(Coda(h_t)))   readable at every t

TRM's recurrence (``recurrence = "trm"``, Jolicoeur-Martineau 2025) carries
two states, the answer y and the latent z, as one state h = [y ; z] of width
2d; a loop is n = ``latent_steps`` latent updates and one answer update, all
by the same core, and the readout (and a halting head) reads y:

    z ← Core(e + y + z)   n times;   y ← Core(y + z)      (y_0 from init_state, z_0 = 0)

Injection: ``add`` gives Core(h + e); ``concat`` gives Core(W_I [e ; h]) with
W_I initialised by ``inject_init``: ``sum`` [I | I] (the default: it starts out
equal to ``add`` and can learn to weigh the two), ``state`` [0 | I], ``input``
[I | 0], ``mix`` [I/2 | I/2] or ``random`` N(0, g²/d); ``contractive`` gives
Core(Ā h + B̄ e) with Ā diagonal and ρ(Ā) < 1 by construction (Parcae;
:mod:`looplab.model.contractive`); ``none`` gives Core(h) from h_0 = e.

Initialisation matters for an untrained core: with LayerNorm holding the
stream at about √d, a layer's relative update scales like the Linear std
times √d, so ``init_std = 0.02`` (GPT-2's) gives LLM-like update ratios only
near d ≈ 768, and ``init_std = 0.4, init_scaling = "sqrt_d"`` gives them at any
width. [I | I] lets a pre-norm state grow without bound (h_t ≈ t·e); a random
W_I with a small gain keeps it bounded.

Notable:
- :meth:`unroll` yields every h_t, so all depths cost one unroll.
- :meth:`forward_at_depths` honours a separate depth per row with active-set
  compaction (:mod:`looplab.model.depths`, shared with every protocol model):
  work is proportional to Σᵢ τᵢ instead of batch × max τ.
- :meth:`observe` installs a hook around every layer call (prelude, core, coda)
  of every forward path; the analysis trace records through it, so what it
  records is what the model computes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from looplab.config import ModelConfig
from looplab.errors import LooplabError, choice_error
from looplab.model.attention import AttentionContext, prefers_math, rope_tables
from looplab.model.contractive import ContractiveInjection
from looplab.model.decoding import Capabilities
from looplab.model.depths import ReadAtDepths
from looplab.model.layer import Layer
from looplab.model.norms import make_norm
from looplab.model.protocol import AttentionWatch, LoopProbe, ObservedLayers

__all__ = ["LoopedTransformer", "LoopProbe", "injection_module", "injection_weight"]


class LoopedTransformer(ReadAtDepths, ObservedLayers, nn.Module):
    """The looped transformer; implements the looped-model protocol (``looplab.model.protocol``), and is its own
    decoding view (:mod:`looplab.model.decoding`: chains of pre-norm layers, RoPE from its config)."""

    capabilities = Capabilities()

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self._layer_hook = None
        d = cfg.d_model
        self.embedding = nn.Embedding(vocab_size, d)
        self.positions = nn.Embedding(cfg.max_len, d) if cfg.positional == "learned" else None
        self.prelude = nn.ModuleList(Layer(cfg) for _ in range(cfg.prelude_layers))
        self.core = nn.ModuleList(Layer(cfg) for _ in range(cfg.core_layers))
        self.coda = nn.ModuleList(Layer(cfg) for _ in range(cfg.coda_layers))
        self.inject = injection_module(cfg.injection, d)
        self.core_out_norm = make_norm(cfg.norm, d) if cfg.core_out_norm else None
        self.final_norm = make_norm(cfg.norm, d)
        self.head = nn.Linear(d, vocab_size)
        linear_std = cfg.init_std / math.sqrt(d) if cfg.init_scaling == "sqrt_d" else cfg.init_std
        self.apply(lambda module: _init_weights(module, linear_std, cfg.embed_std))
        if isinstance(self.inject, ContractiveInjection):
            self.inject.reset_parameters()
        elif self.inject is not None:
            with torch.no_grad():
                self.inject.weight.copy_(injection_weight(cfg.inject_init, d, cfg.inject_gain))

    @contextmanager
    def watch_attention(self, layer: Layer) -> Iterator[AttentionWatch]:
        """Record ``layer``'s attention input and probabilities inside the block (its calls then take the
        math kernel, the one that forms the probabilities)."""
        seen = AttentionWatch()
        handles = [
            layer.attn.register_forward_pre_hook(lambda _module, args: seen.inputs.append(args[0])),
            layer.attn.weights.register_forward_hook(lambda _module, args, out: seen.probs.append(out)),
        ]
        try:
            yield seen
        finally:
            for handle in handles:
                handle.remove()

    def _call(self, site: str, index: int, layer: Layer, x: Tensor, ctx: AttentionContext) -> Tensor:
        if self._layer_hook is None:
            return layer(x, ctx)
        return self._run(site, index, layer, x, lambda y: layer(y, ctx))

    def context(self, valid: Tensor, use_math: bool = False) -> AttentionContext:
        """Attention context for a [B, L] validity mask."""
        kernel, head_dim = self.cfg.attention, self.cfg.d_model // self.cfg.n_heads
        rope = None
        if self.cfg.positional == "rope":
            rope = rope_tables(valid.shape[1], head_dim, self.cfg.rope_base, valid.device, self.head.weight.dtype)
        use_math = use_math or kernel == "math"
        use_math = use_math or (kernel == "auto" and prefers_math(valid.shape[1], head_dim, valid.device))
        return AttentionContext.build(valid, self.cfg.causal, rope, use_math, self.cfg.attention_window)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """tokens [B, L] → E(x) [B, L, d], plus learned positions when configured."""
        x = self.embedding(tokens)
        if self.positions is not None:
            if tokens.shape[1] > self.cfg.max_len:
                raise LooplabError(f"sequence length {tokens.shape[1]} exceeds model.max_len {self.cfg.max_len}")
            x = x + self.positions.weight[: tokens.shape[1]]
        return x

    def encode(self, tokens: Tensor, ctx: AttentionContext) -> Tensor:
        """tokens [B, L] → injected input e [B, L, d] (embedding and prelude)."""
        x = self.embed_tokens(tokens)
        for index, layer in enumerate(self.prelude):
            x = self._call("prelude", index, layer, x, ctx)
        return x

    @property
    def two_state(self) -> bool:
        """Whether a state is TRM's pair [y ; z] (width 2d) rather than one h (width d)."""
        return self.cfg.recurrence == "trm"

    def initial_state(self, e: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """h_0 [B, L, d] from e according to ``init_state`` (``none`` injection always starts at e);
        under TRM's recurrence [y_0 ; 0] [B, L, 2d], y_0 chosen the same way."""
        if self.cfg.injection == "none" or self.cfg.init_state == "embed":
            h = e
        elif self.cfg.init_state == "zeros":
            h = torch.zeros_like(e)
        else:
            noise = torch.randn(e.shape, generator=generator, device="cpu", dtype=torch.float32)
            h = (self.cfg.noise_std * noise).to(device=e.device, dtype=e.dtype)
        return torch.cat([h, torch.zeros_like(h)], dim=-1) if self.two_state else h

    def answer_state(self, h: Tensor) -> Tensor:
        """The part of a state the readout reads [B, L, d]: h itself, or y of TRM's [y ; z]."""
        return h[..., : self.cfg.d_model] if self.two_state else h

    def core_input(self, h: Tensor, e: Tensor) -> Tensor:
        """What the core's first layer sees: h_{t-1} with the input e injected ([B, L, d])."""
        if self.cfg.injection == "add":
            return h + e
        if self.cfg.injection == "concat":
            return self.inject(torch.cat([e, h], dim=-1))
        if self.cfg.injection == "contractive":
            return self.inject(h, e)
        return h

    def step(self, h: Tensor, e: Tensor, ctx: AttentionContext) -> Tensor:
        """One loop: h_{t-1} [B, L, d] → h_t [B, L, d] (TRM: [B, L, 2d] → [B, L, 2d])."""
        if self.two_state:
            y, z = h.chunk(2, dim=-1)
            for _ in range(self.cfg.latent_steps):
                z = self.apply_core(e + y + z, ctx)
            return torch.cat([self.apply_core(y + z, ctx), z], dim=-1)
        return self.apply_core(self.core_input(h, e), ctx)

    def apply_core(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """The shared core once: its k layers, then core_out_norm when configured ([B, L, d] → [B, L, d])."""
        for index, layer in enumerate(self.core):
            x = self._call("core", index, layer, x, ctx)
        if self.core_out_norm is not None:
            x = self.core_out_norm(x)
        return x

    def readout(self, h: Tensor, ctx: AttentionContext, at: Tensor | None = None) -> Tensor:
        """State h [B, L, d] (TRM: [B, L, 2d], of which y is read) → logits [B, L, V]; with ``at`` [B, L]
        bool, [N, V] at those positions (the head is small here: computed everywhere, then selected)."""
        h = self.answer_state(h)
        for index, layer in enumerate(self.coda):
            h = self._call("coda", index, layer, h, ctx)
        logits = self.head(self.final_norm(h))
        return logits if at is None else logits[at]

    def start(
        self, tokens: Tensor, valid: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, AttentionContext]:
        """(h_0, e, ctx) for a batch: the initial state, the injected input and the attention context."""
        ctx = self.context(valid)
        e = self.encode(tokens, ctx)
        return self.initial_state(e, generator), e, ctx

    def unroll(
        self, tokens: Tensor, valid: Tensor, loops: int, generator: torch.Generator | None = None
    ) -> Iterator[tuple[Tensor, AttentionContext]]:
        """Yield (h_t [B, L, d], ctx) for t = 1..loops from one unroll."""
        h, e, ctx = self.start(tokens, valid, generator)
        for _ in range(loops):
            h = self.step(h, e, ctx)
            yield h, ctx

    def forward(self, tokens: Tensor, valid: Tensor, loops: int, generator: torch.Generator | None = None) -> Tensor:
        """Logits [B, L, V] after ``loops`` loops for every row (loops = 0 reads h_0)."""
        h, e, ctx = self.start(tokens, valid, generator)
        for _ in range(loops):
            h = self.step(h, e, ctx)
        return self.readout(h, ctx)


def injection_module(injection: str, d: int) -> nn.Module | None:
    """The injection's own weights: W_I for ``concat``, Ā and B̄ for ``contractive``, none for ``add`` / ``none``."""
    if injection == "concat":
        return nn.Linear(2 * d, d, bias=False)
    if injection == "contractive":
        return ContractiveInjection(d)
    return None


def injection_weight(
    kind: str, d: int, gain: float = 0.25, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> Tensor:
    """The initial W_I [d, 2d] of W_I [e; h]: ``sum`` [I | I], ``state`` [0 | I], ``input`` [I | 0],
    ``mix`` [I/2 | I/2], ``random`` N(0, gain²/d) per entry (drawn from torch's global generator).

    With h_0 = e, every choice whose two blocks add up to I (``state``, ``input``, ``mix``)
    gives W_I [e; h_0] = e, so the first loop sees exactly what the core would without injection.
    """
    eye = torch.eye(d, dtype=dtype, device=device)
    zero = torch.zeros_like(eye)
    blocks = {"sum": (eye, eye), "state": (zero, eye), "input": (eye, zero), "mix": (eye / 2, eye / 2)}
    if kind == "random":
        return torch.randn(d, 2 * d, dtype=dtype, device=device) * (gain / math.sqrt(d))
    if kind not in blocks:
        raise choice_error("injection init", kind, [*blocks, "random"])
    return torch.cat(blocks[kind], dim=1)


def _init_weights(module: nn.Module, linear_std: float, embed_std: float) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=linear_std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=embed_std)
