"""Generation from a retrofitted pretrained LM (:class:`looplab.lm.retrofit.RetrofittedLoop`).

:class:`RetrofitDecoding` puts the retrofit in the shape :func:`looplab.generation.generate` reads
(:func:`looplab.generation.views.decodable` picks it) — embedding, prelude, the looped core with its
injection, coda, final norm and head, each Llama decoder layer seen as two pre-norm residual sublayers — so
the same decoder, caches and exits serve it. Its attention keeps the model's
grouped keys and values (a cache holds H_kv heads, not H), and its rotary tables
come from the model's own rotary module. The middle layers a retrofit keeps run
once per token after the loop, as part of the coda.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from looplab.lm.retrofit import RetrofittedLoop


@dataclass(frozen=True)
class DecodingShape:
    """The model facts the decoder checks and sizes its caches by (the fields of a looplab model config it
    reads), for a pretrained model's decoding view."""

    n_heads: int
    kv_heads: int
    d_model: int
    head_dim: int
    coda_layers: int
    max_len: int
    causal: bool = True
    init_state: str = "embed"  # h_0 = e
    injection: str = "concat"
    positional: str = "rope"
    attention_window: int = 0
    recurrence: str = "standard"  # one carried state, as the decoder requires


class LlamaLayerView:
    """A Llama decoder layer as two pre-norm residual sublayers: x + attn(norm₁ x), then x + mlp(norm₂ x)."""

    def __init__(self, layer: nn.Module):
        self.layer, self.attn, self.mlp = layer, layer.self_attn, layer.mlp

    def attn_residual(self, x: Tensor, attend) -> Tensor:
        return x + attend(self.layer.input_layernorm(x))

    def mlp_residual(self, x: Tensor, mlp) -> Tensor:
        return x + mlp(self.layer.post_attention_layernorm(x))


class RetrofitDecoding(nn.Module):
    """A :class:`RetrofittedLoop` in the shape the generation decoder reads (see the module docstring)."""

    def __init__(self, loop: RetrofittedLoop):
        super().__init__()
        self.loop = loop
        attention = loop.core[0].self_attn
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            d_model=config.hidden_size,
            head_dim=attention.head_dim,
            coda_layers=len(loop.middle) + len(loop.coda),
            max_len=config.max_position_embeddings,
        )
        self.embedding, self.positions = loop.embed, None
        self.prelude = [LlamaLayerView(layer) for layer in loop.prelude]
        self.core = [LlamaLayerView(layer) for layer in loop.core]
        self.coda = [LlamaLayerView(layer) for layer in [*loop.middle, *loop.coda]]
        self.core_out_norm, self.final_norm, self.head = None, loop.norm, loop.lm_head

    def initial_state(self, e: Tensor) -> Tensor:
        return e  # h_0 = e, as RetrofittedLoop.start

    def core_input(self, h: Tensor, e: Tensor) -> Tensor:
        return self.loop.inject(torch.cat([e, h], dim=-1))

    def rope_tables(self, length: int, device, dtype) -> tuple[Tensor, Tensor]:
        return rotary_tables(self.loop.rotary, self.cfg.d_model, length, device, dtype)

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)


def rotary_tables(rotary: nn.Module, width: int, length: int, device, dtype) -> tuple[Tensor, Tensor]:
    """A transformers rotary module's (cos, signed sin) tables [L, Dh] for positions 0..L−1, in the form
    :func:`looplab.model.attention.apply_rope` takes (rotate-half's sign folded into the first half of sin)."""
    probe = torch.zeros(1, length, width, device=device, dtype=dtype)
    cos, sin = rotary(probe, position_ids=torch.arange(length, device=device)[None])
    half = sin.shape[-1] // 2
    return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
