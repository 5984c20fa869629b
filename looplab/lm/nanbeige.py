"""Nanbeige4.2 (``model_type`` ``nanbeige``, ``NanbeigeForCausalLM``), read natively: no remote code.

The published model (Nanbeige4.2-3B: 22 layers, d = 3072, 48 query / 8 key-value heads of width 128 — wider
than d / heads = 64) runs its whole stack of L Llama decoder layers ``num_loops`` = 2 times, with no input
injection:

    x = embed(tokens)                                               no scale
    repeat K times:                                                  one loop of this adapter
        for each layer:  x = x + attn(RMS_in(x))                    Llama's layer: pre-norm, SwiGLU,
                         x = x + mlp(RMS_post(x))                     rotate-half RoPE (θ = rope_theta)
        x = RMS_norm(x)                                             unless skip_loop_final_norm
    x = RMS_norm(x) if skip_loop_final_norm                         the norm then closes the last loop only
    logits = lm_head(x)                                             untied in the published model

K is ``num_loops``, or ``len(loop_loss_weights) + 1`` where that training list is non-empty (the
reference's own rule). Every layer is Llama's exactly, so this module builds transformers'
``LlamaDecoderLayer`` with a Llama config carrying Nanbeige's shapes, under the published names
(``model.layers.N.self_attn.q_proj`` …), and a published checkpoint loads key for key. Each (loop, layer)
holds its own keys and values, as the reference's cache (slot t·L + i) and llama.cpp's unrolled layers do.

The reference carries features the published model leaves off — n-gram embeddings, hyper-connections,
depth attention, LoopSplit and its shared keys and values, per-head q/k norms, tensor-parallel slices —
looplab implements none of them, so a config turning one on is refused naming the field
(:data:`OFF_FEATURES`), never read as a plain Nanbeige.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.config_fields import boolean, check_fields, integer, one_of, positive_number, token_ids
from looplab.lm.llama_blocks import EmbeddingStartLoop, EmbeddingStartView, check_heads, llama_config, load_published
from looplab.lm.native import ModelFamily, layer_view
from looplab.lm.retrofit import LayerContext
from looplab.model.decoding import Capabilities
from looplab.token_exits import MAX_LOOPS

__all__ = ["NanbeigeConfig", "NanbeigeForCausalLM", "NanbeigeLoop", "NanbeigeDecoding"]

#: every config.json field the model reads: its type and domain (:mod:`looplab.lm.config_fields`)
NANBEIGE_FIELDS = {
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"), integer()),
    "num_key_value_heads": integer(optional=True),
    "head_dim": integer(optional=True),
    "num_loops": integer(1, MAX_LOOPS),
    "rms_norm_eps": positive_number(),
    "rope_theta": positive_number(),
    **dict.fromkeys(("tie_word_embeddings", "skip_loop_final_norm", "attention_bias", "mlp_bias"), boolean()),
    "hidden_act": one_of("silu"),
    "pretraining_tp": one_of(1),
    "bos_token_id": token_ids(),
    "eos_token_id": token_ids(),
    "pad_token_id": token_ids(),
}  # fmt: skip

#: the reference's features the published model leaves off, each field → the values that leave it off and
#: what it would turn on; a config setting another value is refused naming the field
OFF_FEATURES: dict[str, tuple[tuple, str]] = {
    "emb_neighbor_num": ((None,), "n-gram embeddings"),
    "emb_split_num": ((None,), "n-gram embeddings"),
    "ngram_vocab_size_ratio": ((None,), "n-gram embeddings"),
    "insert_ngram_layer_idx": ((None, []), "n-gram layer fusion"),
    "ngram_insert_all_layers": ((None, False), "n-gram layer fusion"),
    "enable_hyper_connection": ((None, False), "hyper-connections"),
    "enable_mhc": ((None, False), "manifold-constrained hyper-connections"),
    "enable_depth_attention": ((None, False), "depth attention"),
    "enable_double_loop_split": ((None, False), "LoopSplit (a looped middle block)"),
    "loop_share_kv": ((None, False), "keys and values shared across loops"),
    "qk_layernorm": ((None, False), "per-head query / key norms"),
    "rope_scaling": ((None, {}), "scaled RoPE"),
}


@dataclass
class NanbeigeConfig:
    """The fields of a Nanbeige ``config.json`` this module reads, at the reference's defaults where one is missing."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # default: num_attention_heads
    head_dim: int | None = None  # default: hidden_size // num_attention_heads
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    num_loops: int = 1
    loop_loss_weights: list | None = None
    skip_loop_final_norm: bool = False
    bos_token_id: int | None = 1
    eos_token_id: Any = 2
    pad_token_id: int | None = None
    model_type: str = "nanbeige"
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> NanbeigeConfig:
        check_fields(data, NANBEIGE_FIELDS, where)
        for name, (off, feature) in OFF_FEATURES.items():
            if name in data and data[name] not in off:
                raise LooplabError(
                    f"{where}: {name} = {data[name]!r} turns on {feature}, which the published Nanbeige4.2 does "
                    f"not use and looplab does not implement; set it to {off[-1]!r} or remove it"
                )
        known = {name for name in cls.__dataclass_fields__ if name != "extra"}
        config = cls(
            **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
        )
        config.check(where)
        return config

    def check(self, where: str) -> None:
        """Refuse a config the model cannot be built from, in one line naming the field (each field's type and
        domain by :data:`NANBEIGE_FIELDS`, checked in :meth:`from_dict`; here what relates two fields)."""
        check_heads(self, where)
        weights = self.loop_loss_weights
        if weights is not None and not (
            isinstance(weights, list) and all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
        ):
            raise LooplabError(f"{where}: loop_loss_weights must be a list of numbers, got {weights!r}")
        if self.loops > MAX_LOOPS:
            raise LooplabError(f"{where}: loop_loss_weights asks for {self.loops} loops; looplab runs 1..{MAX_LOOPS}")

    @property
    def loops(self) -> int:
        """The loops the model runs by itself: ``len(loop_loss_weights) + 1`` where that list is non-empty, else
        ``num_loops`` (the reference's rule)."""
        return len(self.loop_loss_weights) + 1 if self.loop_loss_weights else self.num_loops

    def llama(self):
        """transformers' Llama config with Nanbeige's shapes: what its decoder layers and rotary tables read."""
        return llama_config(self, self.attention_bias, self.mlp_bias)


class NanbeigeModel(nn.Module):
    """Embedding, the L Llama decoder layers and the norm (``model.*`` in a checkpoint)."""

    def __init__(self, config: NanbeigeConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

        blocks = config.llama()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(blocks, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)


class NanbeigeForCausalLM(nn.Module):
    """Nanbeige under its published parameter names: ``model.*`` and ``lm_head`` (the rotary table is not stored)."""

    def __init__(self, config: NanbeigeConfig):
        super().__init__()
        self.config = config
        self.model = NanbeigeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_dir(cls, path: Path, config: NanbeigeConfig, dtype: torch.dtype, device: str) -> NanbeigeForCausalLM:
        """The model of ``config`` with the weights of the model dir ``path`` (checked key by key; each attention's
        rotary ``inv_freq``, which some copies of the reference store, is recomputed rather than read)."""
        tables = tuple(f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(config.num_hidden_layers))
        return load_published(cls, path, config, dtype, device, ignored=tables)


class NanbeigeLoop(EmbeddingStartLoop):
    """Nanbeige's K passes as the loop of the looped-model protocol (see the module docstring): h_0 = e =
    embed(tokens); one loop is the L layers and, unless ``skip_loop_final_norm``, the norm; the readout is the
    LM head (after the norm where the loops skip it).

    Layer hooks see site ``"core"`` with index ℓ ∈ 0..L−1.
    """

    model_types = ("nanbeige",)

    def __init__(self, model: NanbeigeForCausalLM, **_):
        super().__init__()
        if not isinstance(model, NanbeigeForCausalLM):
            raise LooplabError(f"{type(model).__name__} is not a Nanbeige causal LM (NanbeigeForCausalLM)")
        self.config = model.config
        self.native_loops = model.config.loops
        self.norm_each_loop = not model.config.skip_loop_final_norm
        inner = model.model
        self.embed, self.norm, self.lm_head, self.rotary = inner.embed_tokens, inner.norm, model.lm_head, model.rotary
        self.prelude, self.coda = nn.ModuleList(), nn.ModuleList()
        self.core = inner.layers

    def step(self, h: Tensor, e: Tensor, ctx: LayerContext) -> Tensor:
        """One loop: the L layers on h [B, T, d], then the norm unless the loops skip it (no injection: e unused)."""
        for index, layer in enumerate(self.core):
            h = self._run("core", index, layer, h, lambda y, layer=layer: self._layer(layer, y, ctx))
        return self.norm(h) if self.norm_each_loop else h

    @staticmethod
    def _layer(layer: nn.Module, x: Tensor, ctx: LayerContext) -> Tensor:
        out = layer(x, attention_mask=ctx.mask, position_embeddings=ctx.rope, use_cache=False)
        return out[0] if isinstance(out, tuple) else out

    def readout(self, h: Tensor, ctx: LayerContext, at: Tensor | None = None) -> Tensor:
        """Logits lm_head(h) [B, T, V] (lm_head(norm(h)) where the loops skip the norm), or [N, V] at ``at``."""
        x = h if at is None else h[at]
        return self.lm_head(x if self.norm_each_loop else self.norm(x))


class NanbeigeDecoding(EmbeddingStartView):
    """A :class:`NanbeigeLoop` in the shape the cached decoder reads (:mod:`looplab.generation.step`): a chain
    of Llama layers closed by the loop's norm (or the norm once, before the head), no injection."""

    capabilities = Capabilities(rope=True)

    def __init__(self, loop: NanbeigeLoop):
        super().__init__(loop)
        self.core = [layer_view(layer) for layer in loop.core]
        if loop.norm_each_loop:
            self.core_out_norm, self.final_norm = loop.norm, nn.Identity()
        else:
            self.core_out_norm, self.final_norm = None, loop.norm


FAMILY = ModelFamily(
    name="Nanbeige4.2",
    model_types={"nanbeige": None},
    adapter=NanbeigeLoop,
    view=NanbeigeDecoding,
    native_loops=lambda config: config.loops,
    one_loop="the L Llama decoder layers, then the norm (unless skip_loop_final_norm; no input injection)",
    core_layers=lambda config: config.num_hidden_layers,
    state_width=lambda config: config.hidden_size,
    config_reader=NanbeigeConfig.from_dict,
    model=NanbeigeForCausalLM,
)
