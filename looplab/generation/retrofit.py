"""Generation from a retrofitted pretrained LM (:class:`looplab.lm.retrofit.RetrofittedLoop`).

:class:`RetrofitDecoding` puts the retrofit in the shape :func:`looplab.generation.generate` reads
(:func:`looplab.generation.views.decodable` picks it) — embedding, prelude, the looped core with its
injection, coda, final norm and head, each Llama decoder layer seen as two pre-norm residual sublayers — so
the same decoder, caches and exits serve it. Its attention keeps the model's
grouped keys and values (a cache holds H_kv heads, not H), and its rotary tables
come from the model's own rotary module. An OLMo-2 layer's norms follow its sublayers
(:class:`looplab.lm.native.Olmo2LayerView`). The middle layers a retrofit keeps run
once per token after the loop, as part of the coda.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from looplab.lm.native import DecodingShape, layer_view, rotary_tables
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model.decoding import Capabilities


class RetrofitDecoding(nn.Module):
    """A :class:`RetrofittedLoop` in the shape the generation decoder reads (see the module docstring)."""

    capabilities = Capabilities(rope=True)

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
        self.prelude = [layer_view(layer) for layer in loop.prelude]
        self.core = [layer_view(layer) for layer in loop.core]
        self.coda = [layer_view(layer) for layer in [*loop.middle, *loop.coda]]
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
