"""What the families looplab builds of transformers' Llama blocks share (:mod:`looplab.lm.ouro`,
:mod:`looplab.lm.nanbeige`): a whole stack of decoder layers looped with no input injection, h₀ = e =
embed(tokens), Llama's rotary tables, and a checkpoint under ``model.*`` and ``lm_head``.

    check_heads          head_dim and the key-value heads, defaulted and checked against the heads
    llama_config         transformers' Llama config carrying a family's shapes
    load_published       a family's module built on the meta device, its checked weights read in
    EmbeddingStartLoop   the adapter's ``start`` and ``context`` (h₀ = e, the causal mask, the rotary tables)
    EmbeddingStartView   the decoding view's shape, state start, injection-free core input and rotary tables
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.native import DecodingShape, NativeLoop, rotary_tables
from looplab.lm.retrofit import LayerContext, causal_mask

__all__ = ["EmbeddingStartLoop", "EmbeddingStartView", "check_heads", "llama_config", "load_published"]


def check_heads(config, where: str) -> None:
    """Default ``head_dim`` (hidden_size / heads) and ``num_key_value_heads`` (the heads) of ``config`` in place,
    refusing in one line a width the heads do not divide and key-value heads that do not divide the heads."""
    if config.head_dim is None and config.hidden_size % config.num_attention_heads:
        raise LooplabError(
            f"{where}: hidden_size ({config.hidden_size}) must be a multiple of num_attention_heads "
            f"({config.num_attention_heads}) when head_dim is not given"
        )
    config.num_key_value_heads = config.num_key_value_heads or config.num_attention_heads
    config.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
    if config.num_attention_heads % config.num_key_value_heads:
        raise LooplabError(
            f"{where}: num_attention_heads ({config.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({config.num_key_value_heads})"
        )


def llama_config(config, attention_bias: bool = False, mlp_bias: bool = False):
    """transformers' Llama config with ``config``'s shapes: what its attention, MLP, norms and rotary tables read
    (eager attention: the adapter passes its own additive mask)."""
    from transformers import LlamaConfig

    llama = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
    )
    llama._attn_implementation = "eager"
    return llama


def load_published(cls, path: Path, config, dtype: torch.dtype, device: str, ignored: tuple[str, ...] = ()):
    """``cls(config)`` (``model.*`` and ``lm_head``) with the weights of the model dir ``path``, checked key by key
    (``ignored``: stored keys it need not read); the head tied to the embedding where the config says, and
    Llama's rotary tables, which no checkpoint stores, built as ``model.rotary``. In eval mode."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from looplab.lm.weights import build_loaded

    embedding = "model.embed_tokens" if config.tie_word_embeddings else None
    model = build_loaded(cls, config, path, dtype, device, embedding, ignored)
    model.rotary = LlamaRotaryEmbedding(llama_config(config)).to(device)
    return model


class EmbeddingStartLoop(NativeLoop):
    """An adapter whose state starts at the embedding and whose layers read Llama's rotary tables; a subclass sets
    ``embed`` and ``rotary``."""

    embed: nn.Embedding
    rotary: nn.Module

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, LayerContext]:
        """(h_0, e, ctx) with h_0 = e = embed(tokens) [B, T, d]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        e = self.embed(input_ids)
        return e, e, self.context(attention_mask)

    def context(self, valid: Tensor) -> LayerContext:
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        positions = torch.arange(valid.shape[1], device=device)[None]
        rope = self.rotary(torch.zeros((), dtype=dtype, device=device), position_ids=positions)
        return LayerContext(rope, causal_mask(valid.to(device), dtype), valid.bool().to(device))


class EmbeddingStartView(nn.Module):
    """The decoding view of an :class:`EmbeddingStartLoop`: its shape (no coda), h₀ = e, no injection, the
    adapter's rotary tables, and the adapter's whole recompute as the uncached reference."""

    def __init__(self, loop: EmbeddingStartLoop):
        super().__init__()
        self.loop = loop
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            d_model=config.hidden_size,
            head_dim=config.head_dim,
            coda_layers=0,
            max_len=config.max_position_embeddings,
        )
        self.embedding, self.positions, self.head = loop.embed, None, loop.lm_head
        self.prelude, self.coda = [], []

    def initial_state(self, e: Tensor) -> Tensor:
        return e

    def core_input(self, h: Tensor, e: Tensor) -> Tensor:
        return h  # no input injection

    def rope_tables(self, length: int, device, dtype) -> tuple[Tensor, Tensor]:
        return rotary_tables(self.loop.rotary, self.cfg.d_model, length, device, dtype)

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)
