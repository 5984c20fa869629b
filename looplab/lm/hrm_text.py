"""HRM-Text (transformers ``HrmTextForCausalLM``, model_type ``hrm_text``) as a looped model.

transformers' forward (``HrmTextModel.forward``) runs two stacks of n decoder layers, each
ending in a weightless RMSNorm, on a slow state z_H and a fast state z_L:

    e      = embedding_scale · embed(tokens)
    z_H, z_L = e, z_L_init                                   z_L_init: a frozen [d] vector (zeros at init)
    repeat H_cycles times:
        repeat L_cycles times:  z_L = L_module(z_L + z_H)
        z_H = H_module(z_H + z_L)
    logits = lm_head(z_H)

One loop of this adapter is one H cycle: the L_cycles L passes and the H pass. The loop state
is the pair, concatenated as h = [z_H | z_L] of shape [B, T, 2d] (so h is twice the model
width: a halting head sized for d does not apply to it), and h_0 = [e | z_L_init]. The
readout reads what transformers reads, ``lm_head(z_H)``; there is no final norm outside the
stacks, no halting head and no special first cycle. With K loops the adapter's logits are
transformers' with ``H_cycles = K`` (tested for K = 1, 2, the native count and twice it).

Held fixed across loop counts: L_cycles, the stacks' weights, z_L_init, and the input
injection — which here is none: this checkpoint family (upstream ``hrm_nocarry_more_bp_no_x``)
feeds the tokens in only through z_H's initial value, so ``step`` ignores ``e``.

Gradients. transformers runs some L passes under ``torch.no_grad()`` (``L_bp_cycles``, left-
padded with 1s to H_cycles: H cycle i keeps gradient through its last ``padded[i]`` L passes,
default ``[2]``, so the last H cycle keeps 2 and every earlier one 1). That rule depends on a
cycle's index counted from the end, which a ``step`` that sees only (h, e, ctx) cannot know, so
the adapter applies one rule to every loop: ``l_grad_passes = None`` (the default) keeps
gradient through every L pass (the exact gradient of the unroll; bound memory with the
schedules' ``backprop_loops`` instead), and ``l_grad_passes = k`` keeps it through the last k L
passes of each loop, as transformers does for all but its trailing H cycles. At inference
(no gradient) the choice changes nothing.

Not carried over: the prefix-LM mask (``token_type_ids == 1`` rows attending bidirectionally;
the protocol's context is built from the validity mask alone, which is what transformers does
when no ``token_type_ids`` are given) and the KV cache. Layer hooks see site ``"core"`` with
index ℓ ∈ 0..n−1 for L-stack layer ℓ (called L_cycles times per loop, so a trace keeps the
last L pass of each loop) and n + ℓ for H-stack layer ℓ.

Decoding. :class:`HrmTextDecoding` puts the adapter in the shape the cached decoder reads
(:mod:`looplab.generation.step`): it runs transformers' own layer modules in the order ``step`` does and
gives every decoder-layer call of a loop its own cache entry, so ``per_loop`` holds what the model computes when
it reruns the whole sequence (as transformers' own generate does: HRM-Text's ``cycle_offset`` gives each (pass,
layer) its own cache slot). One loop is one H cycle: L_cycles passes of the L stack, then the H stack, on the
state h = [z_H | z_L]. Its layers are Llama-like pre-norm layers whose attention (full heads, no q/k norm, RoPE,
scale head_dim^-½) gates its output with sigmoid(gate_proj(x)) before o_proj;
:meth:`looplab.generation.passes.Calls.layer` runs them. Call index c·n + ℓ is L-stack layer ℓ in L pass c,
L_cycles·n + ℓ is H-stack layer ℓ. The next-token logits are lm_head(z_H), so every exit applies, the logit-
reading ones included.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.native import (
    DecodingShape,
    LlamaLayerView,
    ModelFamily,
    NativeLoop,
    prepare_model,
    rotary_tables,
    select_rows,
)
from looplab.model.decoding import Capabilities

__all__ = ["HrmTextLoop", "HrmTextContext", "HrmTextDecoding"]


@dataclass
class HrmTextContext:
    """What every layer call of one batch shares: rotary ``rope`` (cos, sin) [1, T, head_dim], transformers'
    attention ``mask`` ([B, 1, T, T] additive for eager attention; None where the kernel needs none),
    ``positions`` [1, T] and ``valid`` [B, T] bool."""

    rope: tuple[Tensor, Tensor]
    mask: Tensor | None
    positions: Tensor
    valid: Tensor | None = None

    def select(self, rows: Tensor | slice) -> HrmTextContext:
        """The context restricted to some rows of the batch (an index tensor, boolean mask or slice)."""
        return replace(self, mask=select_rows(self.mask, rows), valid=select_rows(self.valid, rows))


class HrmTextLoop(NativeLoop):
    """HRM-Text's H cycle as the loop of the looped-model protocol (see the module docstring).

    Args:
        model: a loaded ``HrmTextForCausalLM``.
        l_grad_passes: gradient flows through the last k L passes of every loop (the earlier ones run
            under ``torch.no_grad()``); None (default): through all of them.
        copy_weights: wrap a deep copy instead of sharing ``model``'s modules (default: share them).
        attn_implementation: the attention kernel to switch the model to (``watch_attention`` needs
            ``"eager"``, the default); None keeps the model's. Without a copy this switches ``model`` too.
    """

    model_types = ("hrm_text",)

    def __init__(
        self,
        model: nn.Module,
        *,
        l_grad_passes: int | None = None,
        copy_weights: bool = False,
        attn_implementation: str | None = "eager",
    ):
        super().__init__()
        if not all(hasattr(getattr(model, "model", None), part) for part in ("L_module", "H_module", "z_L_init")):
            raise LooplabError(f"{type(model).__name__} is not an HRM-Text causal LM (HrmTextForCausalLM)")
        model = prepare_model(model, copy_weights, attn_implementation)
        inner, config = model.model, model.config
        if l_grad_passes is not None and not 0 <= l_grad_passes <= config.L_cycles:
            raise LooplabError(f"l_grad_passes must lie in 0..{config.L_cycles} (L_cycles), got {l_grad_passes}")
        self.config = config
        self.native_loops, self.l_cycles, self.l_grad_passes = config.H_cycles, config.L_cycles, l_grad_passes
        self.embedding_scale = config.embedding_scale
        self.embed, self.rotary, self.lm_head = inner.embed_tokens, inner.rotary_emb, model.lm_head
        self.z_L_init = inner.z_L_init  # frozen, as in transformers
        self.L_norm, self.H_norm = inner.L_module.final_norm, inner.H_module.final_norm
        self.n_stack = len(inner.L_module.layers)
        self.prelude, self.coda = nn.ModuleList(), nn.ModuleList()
        self.core = nn.ModuleList([*inner.L_module.layers, *inner.H_module.layers])

    # ------------------------------------------------------------------ the looped-model protocol

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, HrmTextContext]:
        """(h_0, e, ctx): e = embedding_scale · embed(tokens) [B, T, d] and h_0 = [e | z_L_init] [B, T, 2d]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        e = self.embed(input_ids) * self.embedding_scale
        z_low = self.z_L_init.to(dtype=e.dtype, device=e.device).expand_as(e)
        return torch.cat([e, z_low], dim=-1), e, self.context(attention_mask)

    def context(self, valid: Tensor) -> HrmTextContext:
        """The context of a batch from its validity mask [B, T] (bool, or the 0/1 attention mask) alone,
        with transformers' own mask builder (causal + key padding) and rotary tables."""
        from transformers.masking_utils import create_causal_mask

        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        batch, length = valid.shape
        positions = torch.arange(length, device=device)[None]
        # the mask builder and the rotary tables read only the shape, dtype and device of the embeddings
        shape_of = torch.empty(batch, length, 0, dtype=dtype, device=device)
        rope = self.rotary(shape_of, position_ids=positions)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=shape_of,
            attention_mask=valid.to(device),
            cache=None,
            position_ids=positions,
        )
        return HrmTextContext(rope, mask, positions, valid.bool().to(device))

    def step(self, h: Tensor, e: Tensor, ctx: HrmTextContext) -> Tensor:
        """One H cycle on h = [z_H | z_L] [B, T, 2d]: L_cycles passes z_L = L(z_L + z_H), then z_H = H(z_H + z_L)."""
        z_high, z_low = h.chunk(2, dim=-1)
        tracked = self.l_cycles if self.l_grad_passes is None else self.l_grad_passes
        for cycle in range(self.l_cycles):
            with torch.no_grad() if cycle < self.l_cycles - tracked else nullcontext():
                z_low = self._stack(0, self.L_norm, z_low + z_high, ctx)
        z_high = self._stack(self.n_stack, self.H_norm, z_high + z_low, ctx)
        return torch.cat([z_high, z_low], dim=-1)

    def readout(self, h: Tensor, ctx: HrmTextContext, at: Tensor | None = None) -> Tensor:
        """Logits lm_head(z_H): [B, T, V], or [N, V] at the positions ``at`` [B, T] selects."""
        z_high = h[..., : h.shape[-1] // 2]
        return self.lm_head(z_high if at is None else z_high[at])

    # ------------------------------------------------------------------ layers

    def _stack(self, offset: int, norm: nn.Module, x: Tensor, ctx: HrmTextContext) -> Tensor:
        """One stack (``HrmTextStack.forward``): its n layers (core[offset : offset + n]), then its final norm."""
        for index in range(offset, offset + self.n_stack):
            x = self._call("core", index, self.core[index], x, ctx)
        return norm(x)

    def _call(self, site: str, index: int, layer: nn.Module, x: Tensor, ctx: HrmTextContext) -> Tensor:
        def run(y: Tensor) -> Tensor:
            return layer(
                y, attention_mask=ctx.mask, position_ids=ctx.positions, position_embeddings=ctx.rope, use_cache=False
            )

        return self._run(site, index, layer, x, run)


class HrmTextDecoding(nn.Module):
    """An :class:`HrmTextLoop` in the shape the generation decoder reads (see the module docstring)."""

    capabilities = Capabilities(passes=frozenset({"core", "logits"}), rope=True)

    def __init__(self, loop: HrmTextLoop):
        super().__init__()
        self.loop = loop
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=config.num_attention_heads,
            kv_heads=config.num_attention_heads,  # HRM-Text's attention has no grouped keys and values
            d_model=config.hidden_size,
            head_dim=loop.core[0].self_attn.head_dim,
            coda_layers=0,
            max_len=config.max_position_embeddings,
        )
        views = [LlamaLayerView(layer) for layer in loop.core]
        low, high = views[: loop.n_stack], views[loop.n_stack :]
        # one view per layer call of a loop: the L stack once per L pass, then the H stack
        self.core = low * loop.l_cycles + high
        self.prelude, self.coda, self.positions, self.head = [], [], None, loop.lm_head

    def embedding(self, tokens: Tensor) -> Tensor:
        return self.loop.embed(tokens) * self.loop.embedding_scale

    def initial_state(self, e: Tensor) -> Tensor:
        """h_0 = [e | z_L_init] [.., 2d], as the adapter's ``start``."""
        z_low = self.loop.z_L_init.to(dtype=e.dtype, device=e.device).expand_as(e)
        return torch.cat([e, z_low], dim=-1)

    def core_pass(self, h: Tensor, e: Tensor, calls) -> Tensor:
        """One H cycle on h = [z_H | z_L] [R, m, 2d]: L_cycles passes z_L = L(z_L + z_H), then z_H = H(z_H + z_L)."""
        loop, n = self.loop, self.loop.n_stack
        z_high, z_low = h.chunk(2, dim=-1)
        for cycle in range(loop.l_cycles):
            z_low = self._stack(calls, cycle * n, z_low + z_high, loop.L_norm)
        z_high = self._stack(calls, loop.l_cycles * n, z_high + z_low, loop.H_norm)
        return torch.cat([z_high, z_low], dim=-1)

    def _stack(self, calls, first: int, x: Tensor, norm: nn.Module) -> Tensor:
        for index in range(first, first + self.loop.n_stack):
            x = calls.layer(index, self.core[index], x)
        return norm(x)

    def logits(self, h: Tensor) -> Tensor:
        return self.loop.readout(h, None)

    def rope_tables(self, length: int, device, dtype) -> tuple[Tensor, Tensor]:
        return rotary_tables(self.loop.rotary, self.cfg.d_model, length, device, dtype)

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)


FAMILY = ModelFamily(
    name="HRM-Text",
    model_types={"hrm_text": "HrmTextForCausalLM"},
    adapter=HrmTextLoop,
    view=HrmTextDecoding,
    native_loops=lambda config: config.H_cycles,
    one_loop="one H cycle: L_cycles passes of the L stack, then the H stack",
    core_layers=lambda config: 2 * config.num_hidden_layers,
    state_width=lambda config: 2 * config.hidden_size,  # [z_H | z_L]
)
