"""Ouro (ByteDance's looped LM, ``model_type`` ``ouro``, ``OuroForCausalLM``), read natively: no remote code.

The published model (Ouro-1.4B: 24 layers; 2.6B: 48) runs one stack of L decoder layers T times
(``total_ut_steps``, 4), with no input injection:

    x = embed(tokens)                                               no scale
    repeat T times:                                                  one loop of this adapter
        for each layer:  x = x + RMS_in2(attn(RMS_in1(x)))          the branch output is normed
                         x = x + RMS_post2(mlp(RMS_post1(x)))         before the add (sandwich norms)
        x = RMS_norm(x)                                             h_t, which starts the next loop
    logits = lm_head(h_exit)

Attention is Llama's (rotate-half RoPE, θ = rope_theta; grouped keys and values; no biases), and so
are the MLP and the RMSNorm: this module builds them from transformers' Llama classes with a Llama
config carrying Ouro's shapes, under Ouro's parameter names, so a published checkpoint loads key
for key. What Ouro adds is the four norms per layer, the norm that closes every loop, and a learned
exit gate: g_t = early_exit_gate(h_t) (a Linear(d, 1) with bias), λ_t = σ(g_t),

    p_t = λ_t ∏_{j<t} (1 − λ_j)  for t < T,   p_T = ∏_{j<T} (1 − λ_j)   (the last loop takes the rest)

and a token's exit is the first loop whose cumulative p reaches the threshold τ (``early_exit_threshold``,
1.0 in the published configs: in practice the last loop). :meth:`OuroLoop.exit_distribution` gives p
over the loops; the generation exit ``gate`` (:mod:`looplab.token_exits`) decides with it per token.

:class:`OuroDecoding` is the model as the cached decoder reads it (one cache entry per loop and layer,
as Ouro's own cache: slot t·L + i). :class:`GatedOuroDecoding` carries two channels behind h, the
survival ∏(1 − λ_j) and the cumulative p, so the ``gate`` exit reads its decision off the token's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.config_fields import boolean, check_fields, integer, one_of, positive_number, token_ids, unit_interval
from looplab.lm.llama_blocks import EmbeddingStartLoop, EmbeddingStartView, check_heads, llama_config, load_published
from looplab.lm.native import ModelFamily
from looplab.lm.retrofit import LayerContext
from looplab.model.decoding import Capabilities
from looplab.token_exits import MAX_LOOPS

__all__ = ["OuroConfig", "OuroForCausalLM", "OuroLoop", "OuroDecoding", "GatedOuroDecoding"]


#: every config.json field the model reads: its type and domain (:mod:`looplab.lm.config_fields`)
OURO_FIELDS = {
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"), integer()),
    "num_key_value_heads": integer(optional=True),
    "head_dim": integer(optional=True),
    "total_ut_steps": integer(1, MAX_LOOPS),
    "rms_norm_eps": positive_number(),
    "rope_theta": positive_number(),
    "early_exit_threshold": unit_interval(),
    "tie_word_embeddings": boolean(),
    "hidden_act": one_of("silu"),
    "bos_token_id": token_ids(),
    "eos_token_id": token_ids(),
    "pad_token_id": token_ids(),
}  # fmt: skip


@dataclass
class OuroConfig:
    """The fields of an Ouro ``config.json`` this module reads, at the reference's defaults where one is missing."""

    vocab_size: int = 49152
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None  # default: num_attention_heads
    head_dim: int | None = None  # default: hidden_size // num_attention_heads
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Any = None
    tie_word_embeddings: bool = False
    total_ut_steps: int = 4
    early_exit_threshold: float = 1.0
    bos_token_id: int | None = None
    eos_token_id: Any = None
    pad_token_id: int | None = None
    model_type: str = "ouro"
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> OuroConfig:
        check_fields(data, OURO_FIELDS, where)
        known = {name for name in cls.__dataclass_fields__ if name != "extra"}
        config = cls(
            **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
        )
        config.check(where)
        return config

    def check(self, where: str) -> None:
        """Refuse a config the model cannot be built from, in one line naming the field (each field's type and
        domain by :data:`OURO_FIELDS`, checked in :meth:`from_dict`; here what relates two fields)."""
        check_heads(self, where)
        if self.rope_scaling not in (None, {}):
            raise LooplabError(
                f"{where}: rope_scaling {self.rope_scaling!r} is not supported (the published Ouro has none)"
            )
        layer_types = self.extra.get("layer_types")
        if layer_types is not None and (
            not isinstance(layer_types, list) or len(layer_types) != self.num_hidden_layers
        ):
            raise LooplabError(
                f"{where}: layer_types must list one type per layer (num_hidden_layers {self.num_hidden_layers}), "
                f"got {layer_types!r}"
            )
        sliding = [kind for kind in layer_types or [] if kind != "full_attention"]
        if sliding or self.extra.get("use_sliding_window"):
            raise LooplabError(
                f"{where}: sliding-window layers are not supported (the published Ouro has full attention in "
                "every layer)"
            )

    def llama(self):
        """transformers' Llama config with Ouro's shapes: what its attention, MLP, norms and rotary tables read."""
        return llama_config(self)


class OuroLayer(nn.Module):
    """One Ouro decoder layer: Llama's attention and MLP, each between two RMSNorms (published names)."""

    def __init__(self, config, index: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

        self.self_attn = LlamaAttention(config, index)
        self.mlp = LlamaMLP(config)
        eps = config.rms_norm_eps
        self.input_layernorm, self.input_layernorm_2 = (
            LlamaRMSNorm(config.hidden_size, eps),
            LlamaRMSNorm(config.hidden_size, eps),
        )
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm_2 = LlamaRMSNorm(config.hidden_size, eps)

    @property
    def attn(self) -> nn.Module:
        """The attention, under the name the cached decoder reads."""
        return self.self_attn

    def attn_residual(self, x: Tensor, attend) -> Tensor:
        """x + RMS_in2(attend(RMS_in1(x))) for x [B, T, d]; ``attend`` maps the normed input to the attention output."""
        return x + self.input_layernorm_2(attend(self.input_layernorm(x)))

    def mlp_residual(self, x: Tensor, mlp) -> Tensor:
        """x + RMS_post2(mlp(RMS_post1(x)))."""
        return x + self.post_attention_layernorm_2(mlp(self.post_attention_layernorm(x)))

    def forward(self, x: Tensor, attention_mask: Tensor, position_embeddings: tuple[Tensor, Tensor]) -> Tensor:
        def attend(y: Tensor) -> Tensor:
            return self.self_attn(y, position_embeddings=position_embeddings, attention_mask=attention_mask)[0]

        return self.mlp_residual(self.attn_residual(x, attend), self.mlp)


class OuroModel(nn.Module):
    """Embedding, the L layers, the norm closing every loop, the exit gate (``model.*`` in a checkpoint)."""

    def __init__(self, config: OuroConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        blocks = config.llama()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(OuroLayer(blocks, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.early_exit_gate = nn.Linear(config.hidden_size, 1, bias=True)


class OuroForCausalLM(nn.Module):
    """Ouro under its published parameter names: ``model.*`` and ``lm_head`` (the rotary table is not stored)."""

    def __init__(self, config: OuroConfig):
        super().__init__()
        self.config = config
        self.model = OuroModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_dir(cls, path: Path, config: OuroConfig, dtype: torch.dtype, device: str) -> OuroForCausalLM:
        """The model of ``config`` with the weights of the model dir ``path`` (checked key by key)."""
        return load_published(cls, path, config, dtype, device)


class OuroLoop(EmbeddingStartLoop):
    """Ouro's T steps as the loop of the looped-model protocol (see the module docstring): h_0 = e = embed(tokens),
    one loop is the L layers and the closing norm, and the readout is the LM head (no final norm beyond it).

    Layer hooks see site ``"core"`` with index ℓ ∈ 0..L−1.
    """

    model_types = ("ouro",)

    def __init__(self, model: OuroForCausalLM, **_):
        super().__init__()
        if not isinstance(model, OuroForCausalLM):
            raise LooplabError(f"{type(model).__name__} is not an Ouro causal LM (OuroForCausalLM)")
        self.config = model.config
        self.native_loops = model.config.total_ut_steps
        inner = model.model
        self.embed, self.norm, self.gate, self.lm_head = (
            inner.embed_tokens,
            inner.norm,
            inner.early_exit_gate,
            model.lm_head,
        )
        self.rotary = model.rotary
        self.prelude, self.coda = nn.ModuleList(), nn.ModuleList()
        self.core = inner.layers

    def step(self, h: Tensor, e: Tensor, ctx: LayerContext) -> Tensor:
        """One loop: the L layers on h [B, T, d], then the closing norm (Ouro has no input injection: e is unused)."""
        for index, layer in enumerate(self.core):
            h = self._run("core", index, layer, h, lambda y, layer=layer: layer(y, ctx.mask, ctx.rope))
        return self.norm(h)

    def readout(self, h: Tensor, ctx: LayerContext, at: Tensor | None = None) -> Tensor:
        """Logits lm_head(h): [B, T, V], or [N, V] at the positions ``at`` [B, T] selects."""
        return self.lm_head(h if at is None else h[at])

    def exit_distribution(self, states: list[Tensor]) -> Tensor:
        """p [T, ...]: the exit distribution over the loops of the states h_1..h_T (each [..., d]); the last
        loop takes the mass the earlier ones leave (its own gate is not read)."""
        if len(states) == 1:
            return torch.ones_like(states[0][..., 0], dtype=torch.float32)[None]
        lam = torch.stack([torch.sigmoid(self.gate(h).squeeze(-1).float()) for h in states[:-1]])
        survival = torch.cumprod(1 - lam, dim=0)
        before = torch.cat([torch.ones_like(survival[:1]), survival[:-1]])
        return torch.cat([lam * before, survival[-1:]])


class OuroDecoding(EmbeddingStartView):
    """An :class:`OuroLoop` in the shape the cached decoder reads (:mod:`looplab.generation.step`): a chain of
    pre-norm layers (the sandwich norms inside them) closed by the loop's norm, no injection, no final norm."""

    #: own RoPE tables; a learned exit gate (:meth:`with_gate` is the view that carries its decision)
    capabilities = Capabilities(rope=True, gate=True)

    def __init__(self, loop: OuroLoop):
        super().__init__(loop)
        self.core = list(loop.core)
        self.core_out_norm, self.final_norm = loop.norm, nn.Identity()

    @staticmethod
    def with_gate(loop: OuroLoop) -> GatedOuroDecoding:
        """The view of ``loop`` whose state carries the gate's decision (for the ``gate`` exit)."""
        return GatedOuroDecoding(loop)


class GatedOuroDecoding(OuroDecoding):
    """The Ouro view whose state carries the exit gate's decision: [h | S | C] [.., d + 2], with
    S = ∏_{j≤t}(1 − λ_j) and C = Σ_{j≤t} λ_j ∏_{i<j}(1 − λ_i) after loop t (in the state's dtype), which the
    ``gate`` exit compares with τ. Its own ``core_pass`` reaches the layers through the decoder's calls alone
    (``layerwise``), so every decoder that batches tokens at different loops takes it."""

    capabilities = Capabilities(passes=frozenset({"core", "logits"}), rope=True, gated=True, gate=True, layerwise=True)

    def initial_state(self, e: Tensor) -> Tensor:
        return torch.cat([e, torch.ones_like(e[..., :1]), torch.zeros_like(e[..., :1])], dim=-1)

    def core_pass(self, h: Tensor, e: Tensor, calls) -> Tensor:
        """One loop on new tokens' states h [R, m, d + 2]: the L layers through the cache, the norm, the gate."""
        d = self.cfg.d_model
        x = h[..., :d]
        for index, layer in enumerate(self.core):
            x = calls.layer(index, layer, x)
        x = self.loop.norm(x)
        survival, cumulative = h[..., d], h[..., d + 1]
        lam = torch.sigmoid(self.loop.gate(x).squeeze(-1))
        cumulative = cumulative + lam * survival
        survival = survival * (1 - lam)
        return torch.cat([x, survival[..., None], cumulative[..., None]], dim=-1)

    def logits(self, h: Tensor) -> Tensor:
        return self.loop.lm_head(h[..., : self.cfg.d_model])


FAMILY = ModelFamily(
    name="Ouro",
    model_types={"ouro": None},
    adapter=OuroLoop,
    view=OuroDecoding,
    native_loops=lambda config: config.total_ut_steps,
    one_loop="the L decoder layers, then the norm that closes them (no input injection)",
    core_layers=lambda config: config.num_hidden_layers,
    state_width=lambda config: config.hidden_size,
    config_reader=OuroConfig.from_dict,
    model=OuroForCausalLM,
    exit_defaults=lambda config: {"gate": {"threshold": config.early_exit_threshold}},
)
