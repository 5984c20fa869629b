"""Parcae (SandyResearch's stable looped LM, arXiv 2604.12946), read natively from its own checkpoints: a
``config.json`` that is the reference's config dataclass saved whole (``_class_name`` ``ParcaeConfig``, no
``model_type``) beside ``pytorch_model.bin``. No reference code runs.

The published models (140M: width 768, 6 heads, (2, 2, 2) blocks; 770M: width 1280, 10 heads, (6, 6, 6);
8 recurrences, vocabulary 32768, the head tied to the embedding):

    e = ln_prelude(prelude(wte[tokens]))                  once per token (wte × embed scale: 1 in the published)
    x = x_0                                               zeros here (see below)
    repeat N times:  x = core(decay ⊙ x + Δ ⊙ (e Bᵀ))     one loop: the diagonal injection, then the core blocks
    logits = lm_head(ln_f(coda(C x)))                     × logit scale (1), soft-capped where logit_softcap is set

with Δ = softplus(dt_bias) and decay = exp(−Δ · exp(A_log)) per state channel: the injection is a linear
recurrence of spectral radius max(decay) < 1, the paper's stability argument (:meth:`ParcaeLoop.injection_decay`).
The reference's other injections are read too: ``linear`` (a Linear on [x, e]) and ``add`` (x + e).

Every block is pre-norm, attn(norm_1 x) + x, then mlp(norm_2 x) + x; the published MLP is proj(½·relu(fc x)²).
Attention projects q, k, v apart (grouped keys and values in the prelude and coda; the core blocks, built from
the reference's recurrent config, have as many key/value heads as heads), adds a gated value embedding where
the reference does, clips q, k, v (``clip_qkv``), adds a q/k bias (``qk_bias``), RMS-normalises q and k per head
without a weight (``qk_norm``), rotates *adjacent pairs* (x_2i, x_2i+1) by RoPE (``rope_settings``) and
attends causally at scale Dh^−½.

Where the value embeddings sit (the reference's parity rules), and the config's checks:
:mod:`looplab.lm.parcae_config`; the modules under the published names: :mod:`looplab.lm.parcae_model`.

Differences from the reference code, on purpose:
- the recurrent state starts at **zero** by default, deterministic; the reference draws x_0 per ``state_init``
  (``like-init`` in the published configs: a truncated normal on torch's global generator).
  ``state_init="random"`` draws it as the reference does, from the generator ``start`` is given;
- the attention mask is honoured (the reference ignores ``attention_mask``: a padded batch attends to its
  padding);
- the loop count is the caller's (the reference's own forward draws a Poisson depth per sequence unless one
  is given); the training-only fields (sampling, backprop depth, checkpointing, fused losses) are not read,
  but for mean_backprop_depth's part in placing the value-embedding gates;
- the rotary table is computed from ``rope_settings``: a stored ``freqs_cis`` buffer is accepted and ignored;
- q and k are RMS-normalised before the rotation, not after: a rotation keeps each head's norm, so this is
  the same to rounding, and lets the cached decoder rotate as for every other family (pairs are rotated as
  rotate-half on de-interleaved heads, which leaves every q·k unchanged);
- logits are in float32 or wider (the reference's float32; float64 in a float64 model).

The value embeddings read the token ids, so the adapter's context carries them (:class:`ParcaeContext`): the
one ``start`` builds, narrowed by ``ctx.select(rows)`` (what depth-wise readouts, halting schedules, the
regularisers' probes and the spectral analysis keep); one built by ``context(valid)`` alone is refused by
any block that needs them, in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.native import DecodingShape, ModelFamily, NativeLoop, pair_rope_tables
from looplab.lm.parcae_config import SMALL_INIT, STATE_INITS, ParcaeConfig
from looplab.lm.parcae_model import DiagonalInjection, ParcaeBlock, ParcaeForCausalLM
from looplab.lm.retrofit import LayerContext, causal_mask
from looplab.model.decoding import Capabilities

__all__ = ["ParcaeConfig", "ParcaeForCausalLM", "ParcaeLoop", "ParcaeDecoding"]


def rope_tables(config: ParcaeConfig, length: int, device) -> tuple[Tensor, Tensor]:
    """(cos, signed sin) [length, Dh] in float32 for de-interleaved heads (the reference's frequencies)."""
    settings = config.rope_settings
    base, condense = settings.get("rope_base", 50000), settings.get("rope_condense_ratio", 1)
    return pair_rope_tables(config.head_dim, base, length, device, condense)


@dataclass
class ParcaeContext(LayerContext):
    """A :class:`LayerContext` with the batch's token ids [B, T], which the value embeddings read."""

    tokens: Tensor | None = None

    def select(self, rows: Tensor | slice) -> ParcaeContext:
        chosen = super().select(rows)
        return replace(chosen, tokens=None if self.tokens is None else self.tokens[rows])


class ParcaeLoop(NativeLoop):
    """Parcae's recurrence as the loop of the looped-model protocol (see the module docstring).

    Args:
        model: a :class:`ParcaeForCausalLM`.
        state_init: ``zero`` (default) or ``random`` (the reference's draw for the config's ``state_init``, from
            ``start``'s generator).

    Layer hooks see sites ``"prelude"``, ``"core"`` and ``"coda"`` with each block's index there. The context
    carries the token ids (see the module docstring).
    """

    model_types = ("parcae",)

    def __init__(self, model: ParcaeForCausalLM, *, state_init: str = "zero", **_):
        super().__init__()
        if not isinstance(model, ParcaeForCausalLM):
            raise LooplabError(f"{type(model).__name__} is not a Parcae causal LM (ParcaeForCausalLM)")
        if state_init not in STATE_INITS:
            raise LooplabError(f"unknown Parcae state_init {state_init!r}; valid choices: {', '.join(STATE_INITS)}")
        config = model.config
        if state_init == "random" and config.state_init == "like-init" and config.init_strategy not in SMALL_INIT:
            raise LooplabError(f"state_init='random' draws like-init for init_strategy in {', '.join(SMALL_INIT)}; "
                               f"this config has {config.init_strategy!r}")  # fmt: skip
        self.config, self.state_init, self.native_loops = config, state_init, config.mean_recurrence
        parts = model.transformer
        self.embed, self.injection, self.C, self.ln_f = parts["wte"], parts["adapter"], parts["C"], parts["ln_f"]
        self.ln_prelude = parts["ln_prelude"] if config.prelude_norm else None
        self.prelude, self.core, self.coda = parts["prelude"], parts["core_block"], parts["coda"]
        self.value_embeds, self.lm_head = model.value_embeds, model.lm_head

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, ParcaeContext]:
        """(x_0, e, ctx): e = ln_prelude(prelude(wte[ids])) [B, T, d]; x_0 [B, T, d_state] zeros (or the
        reference's random draw)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        ctx = self.context(attention_mask, input_ids)
        x = self.embed_tokens(input_ids)
        for index, block in enumerate(self.prelude):
            x = self._block("prelude", index, block, x, ctx)
        if self.ln_prelude is not None:
            x = self.ln_prelude(x)
        return self.initial_state(x, generator), x, ctx

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        return x if self.config.embed_scale == 1 else x * self.config.embed_scale

    def initial_state(self, e: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """x_0 [B, T, d_state]: zeros, or the reference's draw for the config's ``state_init`` from ``generator``."""
        config, shape = self.config, (*e.shape[:-1], self.config.recurrent_embedding_dimension)
        kind = "zero" if self.state_init == "zero" else config.state_init
        if kind == "zero":
            return e.new_zeros(shape)
        x = torch.randn(shape, generator=generator)
        if kind == "embed":
            x = x / math.sqrt(config.n_embd)
        elif kind == "unit":
            std, mean = torch.std_mean(x, dim=-1, keepdim=True)
            x = (x - mean) / (std + 1e-8)
        elif kind == "like-init":
            std = math.sqrt(2 / (5 * config.n_embd))
            nn.init.trunc_normal_(x, std=std, a=-3 * std, b=3 * std, generator=generator)
            x = x * config.embed_scale
        return x.to(dtype=e.dtype, device=e.device)

    def context(self, valid: Tensor, tokens: Tensor | None = None) -> ParcaeContext:
        device = self.embed.weight.device
        rope = rope_tables(self.config, valid.shape[1], device)
        tokens = None if tokens is None else tokens.to(device)
        return ParcaeContext(rope, causal_mask(valid.to(device), torch.float32), valid.bool().to(device), tokens)

    def step(self, h: Tensor, e: Tensor, ctx: ParcaeContext) -> Tensor:
        """One recurrence: the injection of e into h, then the core blocks."""
        x = self.injection(h, e)
        for index, block in enumerate(self.core):
            x = self._block("core", index, block, x, ctx)
        return x

    def readout(self, h: Tensor, ctx: ParcaeContext, at: Tensor | None = None) -> Tensor:
        """Logits of lm_head(ln_f(coda(C h))) [B, T, V], or [N, V] at the positions ``at`` [B, T] selects (the
        coda attends over the whole sequence first)."""
        x = self.C(h)
        for index, block in enumerate(self.coda):
            x = self._block("coda", index, block, x, ctx)
        x = self.ln_f(x)
        return self.logits(x if at is None else x[at])

    def logits(self, x: Tensor) -> Tensor:
        """The head on final-normed states x [..., d]: in float32 or wider, scaled, soft-capped where set."""
        logits = self.lm_head(x)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * self.config.logit_scale
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def injection_decay(self) -> Tensor:
        """[d_state]: exp(−softplus(dt_bias) · exp(A_log)), what the diagonal injection keeps of each state
        channel per loop; its maximum is the injection's spectral radius (the paper's stability bound)."""
        if not isinstance(self.injection, DiagonalInjection):
            raise LooplabError(f"the {self.config.injection_type!r} injection has no diagonal decay (only 'diagonal')")
        return self.injection.decay()

    def injection_radius(self) -> float | None:
        """The spectral radius of the injection's own recurrence x ↦ decay ⊙ x, max(decay) (the paper's stability
        argument, which ``analyze spectral`` prints beside the loop map's); None for an injection without one."""
        if not isinstance(self.injection, DiagonalInjection):
            return None
        with torch.no_grad():
            return float(self.injection.decay().max())

    def value_embedding(self, site: str, index: int, tokens: Tensor | None) -> Tensor | None:
        """[B, T, kv width]: the value embedding block ``index`` of ``site`` adds for ``tokens``, or None."""
        key = self.config.value_table(site, index)
        if key is None:
            return None
        if tokens is None:
            raise LooplabError(
                "Parcae's value embeddings read the token ids: its context comes from start() (narrowed by "
                "ctx.select(rows)), not from context(valid) alone"
            )
        return self.value_embeds[key](tokens)

    def watch_attention(self, layer: nn.Module):
        from looplab.lm.retrofit import watch_decoder_attention

        return watch_decoder_attention(layer, layer.attn)

    def _block(self, site: str, index: int, block: nn.Module, x: Tensor, ctx: ParcaeContext) -> Tensor:
        ve = self.value_embedding(site, index, ctx.tokens)
        return self._run(site, index, block, x, lambda y: block(y, ctx.mask, ctx.rope, ve))


#: the decoder's per-slot store (looplab.generation.cache.KVCache.history) of the new tokens' ids
TOKEN_STORE = ("prelude", 0, "token_ids")


class ParcaeDecoding(nn.Module):
    """A :class:`ParcaeLoop` in the shape the cached decoder reads (:mod:`looplab.generation.step`).

    The value embeddings read each token's id inside attention, and the decoder hands a view its tokens at
    ``embedding`` alone: so ``embedding`` passes the ids through, the prelude pass embeds them and keeps them
    in the decoder's per-slot store, and the core and coda passes read them back for the slots they run. So
    each pass is the view's own (none is a chain of the decoder's layers: depth-wise and wavefront batching
    refuse it); every cache policy applies, one entry per (recurrence, core block) under ``per_loop``.
    """

    capabilities = Capabilities(passes=frozenset({"prelude", "core", "coda", "logits"}), rope=True)

    def __init__(self, loop: ParcaeLoop):
        super().__init__()
        if loop.state_init != "zero":
            raise LooplabError("generation starts Parcae's state at zero (state_init='zero'): a random start "
                               "would need a draw per token")  # fmt: skip
        self.loop = loop
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=max(config.num_attention_heads, config.core_heads),
            kv_heads=max(config.num_key_value_heads, config.core_heads),
            d_model=max(config.n_embd, config.recurrent_embedding_dimension),
            head_dim=config.head_dim,
            coda_layers=len(loop.coda),
            max_len=config.block_size,
            init_state="zero",
        )
        self.positions, self.head, self.final_norm, self.core_out_norm = None, loop.lm_head, loop.ln_f, None
        self.prelude, self.core, self.coda = list(loop.prelude), list(loop.core), list(loop.coda)

    def embedding(self, tokens: Tensor) -> Tensor:
        return tokens  # the prelude pass embeds them, beside their value embeddings

    def initial_state(self, e: Tensor) -> Tensor:
        return e.new_zeros(*e.shape[:-1], self.loop.config.recurrent_embedding_dimension)

    def core_input(self, h: Tensor, e: Tensor) -> Tensor:
        return self.loop.injection(h, e)

    def prelude_pass(self, tokens: Tensor, calls) -> Tensor:
        """e [R, m, d] of the new tokens' ids [R, m], which it keeps for the later passes of these slots."""
        self._tokens(calls)[calls.rows, calls.chunk] = tokens[..., None]
        x = self.loop.embed_tokens(tokens)
        for index, block in enumerate(self.prelude):
            x = self._layer(calls, "prelude", index, block, x, tokens)
        return x if self.loop.ln_prelude is None else self.loop.ln_prelude(x)

    def core_pass(self, h: Tensor, e: Tensor, calls) -> Tensor:
        tokens = self._tokens(calls)[calls.rows, calls.chunk, 0]
        x = self.core_input(h, e)
        for index, block in enumerate(self.core):
            x = self._layer(calls, "core", index, block, x, tokens)
        return x

    def coda_pass(self, h: Tensor, calls) -> Tensor:
        """C, then the coda blocks through their cache (the logits apply ln_f)."""
        tokens = self._tokens(calls)[calls.rows, calls.chunk, 0]
        x = self.loop.C(h)
        for index, block in enumerate(self.coda):
            x = self._layer(calls, "coda", index, block, x, tokens)
        return x

    def logits(self, h: Tensor) -> Tensor:
        return self.loop.logits(self.loop.ln_f(h))

    def rope_tables(self, length: int, device, dtype) -> tuple[Tensor, Tensor]:
        cos, sin = rope_tables(self.loop.config, length, device)
        return cos.to(dtype), sin.to(dtype)

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)

    @staticmethod
    def _tokens(calls) -> Tensor:
        """[B, S, 1] long: the token id in each slot, as the prelude pass stored it."""
        site, loop, name = TOKEN_STORE
        return calls.decoder.cache.history(site, loop, name, 1, torch.long).values

    def _layer(self, calls, site: str, index: int, block: ParcaeBlock, x: Tensor, tokens: Tensor) -> Tensor:
        """Block call ``index`` of ``site`` on new tokens x [R, m, width] through its cache entry (shaped by the
        block's own key/value heads: the core's may differ from the prelude's), with its value embedding."""
        attn = block.attn
        calls.entry(index, attn.kv_heads, attn.head_dim)  # created in this block's shape before the call reads it
        ve = self.loop.value_embedding(site, index, tokens)
        if ve is None:
            return calls.layer(index, block, x)
        view = SimpleNamespace(
            attn=SimpleNamespace(project_heads=partial(attn.project_heads, ve=ve), merge_heads=attn.merge_heads,
                                 scaling=attn.scaling),
            attn_residual=block.attn_residual, mlp_residual=block.mlp_residual, mlp=block.mlp,
        )  # fmt: skip
        return calls.layer(index, view, x)


FAMILY = ModelFamily(
    name="Parcae",
    model_types={"parcae": None},
    adapter=ParcaeLoop,
    view=ParcaeDecoding,
    native_loops=lambda config: config.mean_recurrence,
    one_loop="the diagonal injection of the prelude's output, then the core blocks",
    core_layers=lambda config: config.n_layers_in_recurrent_block,
    state_width=lambda config: config.recurrent_embedding_dimension,
    config_reader=ParcaeConfig.from_dict,
    model=ParcaeForCausalLM,
    config_class_names=("ParcaeConfig",),
)
