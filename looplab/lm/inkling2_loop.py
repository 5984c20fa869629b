"""Inkling-2's looped text model (transformers ``Inkling2LoopForCausalLM``, model_type
``inkling2_loop_text``; the text path of ``Inkling2LoopForConditionalGeneration``,
``inkling2_loop``) as a looped model.

Inkling-2's residual stream is a pair: the current hidden state x [B, T, d] and the block
states [B, T, n, d] that the block attention residuals read (a layer at a block boundary,
every ``n_layers_per_attn_res_block`` layers, appends its input x as a new block).
transformers' forward (``Inkling2LoopTextModel.forward``), with s..e−1 the looped layers:

    x, blocks = embed(tokens), []
    layers 0..s−1                                        once: the pre-loop state (x_s, blocks_s)
    pass 1:  layers s..e−1 from (x_s, blocks_s)          without messages
    pass p > 1:  layers s..e−1 from (x_s, blocks_s)      again from the pre-loop state, each loop
                 layer j receiving messages [B, T, 4, d] (for its query, key, value and MLP
                 inputs, mixed in by its message gates) that ``message_input`` reads from
                 the previous pass's own blocks and final x
    layers e..L−1 on (x, blocks) of the last pass        once
    logits = softcap(lm_head(norm(final_input(blocks, x))))

One loop of this adapter is one pass through layers s..e−1: prelude = layers[:s], core =
layers[s:e], coda = layers[e:]. The loop state is everything the next pass and the coda read,
(blocks, x) after the pass, packed as h = [blocks₀ | … | blocks_{n−1} | x] [B, T, (n + 1)·d]
(the blocks include the pre-loop ones, which the coda reads). Every pass restarts from the
pre-loop state, so that is the injected input: e = (blocks_s, x_s) packed the same way,
[B, T, (n_s + 1)·d], and h_0 = e. The first pass is special (no messages, no message gates):
``step`` recognises h_0 by its width (the state before the loop has fewer blocks than any state
after a pass) and runs pass 1 on it, so ``step`` stays a pure function of (h, e, ctx) and K
loops give transformers' logits with ``loop_num_passes = K`` (tested for K = 1, 2, the native
count and twice it). ``readout(h_0)`` runs the coda on the pre-loop state (the loop skipped), which no
transformers config can express.

Held fixed across loop counts: the layers and gates, the pre-loop state every pass restarts
from, and the message readout (one learned query per loop layer, the same at every pass).
There is no gradient truncation in transformers' forward; gradients flow through every pass.

Not carried over: the KV / convolution cache (generation) and image inputs. Layer hooks see
the hidden state x (the block states ride along in the layer's context); the block a boundary
layer appends is the x the layer received, after any hook.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.native import NativeLoop, prepare_model, select_rows

__all__ = ["Inkling2Loop", "Inkling2LoopContext"]


@dataclass
class Inkling2LoopContext:
    """What every layer call of one batch shares, built by transformers' own helpers: the attention
    ``masks`` by layer attention type ([B, 1, T, T] additive for eager attention), the convolutions'
    padding mask ``conv_mask`` [B, T] (None without padding), the ``distances`` [T, T] of the relative
    position bias by attention type, ``positions`` [1, T] and ``valid`` [B, T] bool."""

    masks: dict[str, Tensor | None]
    conv_mask: Tensor | None
    distances: dict[str, Tensor]
    positions: Tensor
    valid: Tensor | None = None

    def select(self, rows: Tensor | slice) -> Inkling2LoopContext:
        """The context restricted to some rows of the batch (an index tensor, boolean mask or slice)."""
        return replace(
            self,
            masks={kind: select_rows(mask, rows) for kind, mask in self.masks.items()},
            conv_mask=select_rows(self.conv_mask, rows),
            valid=select_rows(self.valid, rows),
        )


class Inkling2Loop(NativeLoop):
    """Inkling-2's loop pass as the loop of the looped-model protocol (see the module docstring).

    Args:
        model: a loaded ``Inkling2LoopForCausalLM`` (or ``Inkling2LoopForConditionalGeneration``,
            whose text path is wrapped).
        copy_weights: wrap a deep copy instead of sharing ``model``'s modules (default: share them).
        attn_implementation: the attention kernel to switch the model to (Inkling-2 supports only
            ``"eager"``, the default); None keeps the model's.
    """

    model_types = ("inkling2_loop_text", "inkling2_loop")

    def __init__(self, model: nn.Module, *, copy_weights: bool = False, attn_implementation: str | None = "eager"):
        super().__init__()
        inner = getattr(model, "model", None)
        text = getattr(inner, "language_model", inner)
        if not all(hasattr(text, part) for part in ("layers", "message_input", "final_input")):
            raise LooplabError(f"{type(model).__name__} is not an Inkling-2 looped LM (Inkling2LoopForCausalLM)")
        model = prepare_model(model, copy_weights, attn_implementation)
        inner = model.model
        text = getattr(inner, "language_model", inner)
        config = text.config
        start, end = config.loop_layer_index_start, config.loop_layer_index_end
        if not 0 < start < end <= len(text.layers):
            raise LooplabError(f"the looped layers {start}..{end - 1} are not inside the model's {len(text.layers)}")
        self.config, self.native_loops = config, config.loop_num_passes
        self.embed, self.norm = text.embed_tokens, text.norm
        self.message_input, self.final_input = text.message_input, text.final_input
        self.lm_head, self.logit_softcap = model.lm_head, model.logit_softcap
        self.prelude = nn.ModuleList(text.layers[:start])
        self.core = nn.ModuleList(text.layers[start:end])
        self.coda = nn.ModuleList(text.layers[end:])
        # the blocks of the pre-loop state: pass 1's first layer appends its input, x_s, as one more
        self.pre_loop_blocks = sum(layer.is_block_boundary for layer in self.prelude)

    # ------------------------------------------------------------------ the looped-model protocol

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Inkling2LoopContext]:
        """(h_0, e, ctx): the pre-loop state (blocks_s, x_s) packed [B, T, (n_s + 1)·d] is both e and h_0."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        ctx = self.context(attention_mask)
        x = self.embed(input_ids)
        blocks = x.new_zeros(*x.shape[:-1], 0, x.shape[-1])
        for index, layer in enumerate(self.prelude):
            x, blocks = self._call("prelude", index, layer, x, blocks, None, ctx)
        e = _pack(blocks, x)
        return e, e, ctx

    def context(self, valid: Tensor) -> Inkling2LoopContext:
        """The context of a batch from its validity mask [B, T] (bool, or the 0/1 attention mask) alone."""
        from transformers.masking_utils import (
            create_causal_mask,
            create_recurrent_attention_mask,
            create_sliding_window_causal_mask,
        )
        from transformers.models.inkling2_loop.modeling_inkling2_loop import get_relative_distance

        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        batch, length = valid.shape
        positions = torch.arange(length, device=device)[None]
        # the mask builders read only the shape, dtype and device of the embeddings
        shape_of = torch.empty(batch, length, 0, dtype=dtype, device=device)
        options = {
            "config": self.config,
            "inputs_embeds": shape_of,
            "attention_mask": valid.to(device),
            "cache": None,
            "position_ids": positions,
        }
        masks = {
            "full_attention": create_causal_mask(**options),
            "sliding_attention": create_sliding_window_causal_mask(**options),
        }
        distances = {
            "full_attention": get_relative_distance(shape_of, None, is_sliding=False),
            "sliding_attention": get_relative_distance(shape_of, None, is_sliding=True),
        }
        return Inkling2LoopContext(
            masks, create_recurrent_attention_mask(**options), distances, positions, valid.bool().to(device)
        )

    def step(self, h: Tensor, e: Tensor, ctx: Inkling2LoopContext) -> Tensor:
        """One pass through the looped layers from the pre-loop state e, with messages from the previous
        pass h (none when h is h_0 = e, the first pass)."""
        d = self.embed.weight.shape[1]
        blocks, x = _unpack(e, d)
        previous = None
        if h.shape[-1] != e.shape[-1]:
            previous_blocks, previous_x = _unpack(h, d)
            # the pass's own blocks, without x_s (the block its first layer appends, the same every pass)
            previous = (previous_blocks[..., self.pre_loop_blocks + 1 :, :], previous_x)
        for index, layer in enumerate(self.core):
            messages = None if previous is None else self.message_input(*previous, index)
            x, blocks = self._call("core", index, layer, x, blocks, messages, ctx)
        return _pack(blocks, x)

    def readout(self, h: Tensor, ctx: Inkling2LoopContext, at: Tensor | None = None) -> Tensor:
        """Logits (soft-capped, float32) [B, T, V] from the loop state: the coda, the final block attention
        residual, norm and head; with ``at`` ([B, T] bool) only at those positions, [N, V]."""
        blocks, x = _unpack(h, self.embed.weight.shape[1])
        for index, layer in enumerate(self.coda):
            x, blocks = self._call("coda", index, layer, x, blocks, None, ctx)
        if at is not None:  # the rest is per position: the N chosen positions as one row
            blocks, x = blocks[at][None], x[at][None]
        x = self.norm(self.final_input(blocks, x)[0]).to(self.embed.weight.dtype)
        logits = self.logit_softcap(self.lm_head(x).float())
        return logits if at is None else logits[0]

    # ------------------------------------------------------------------ layers

    def _call(
        self,
        site: str,
        index: int,
        layer: nn.Module,
        x: Tensor,
        blocks: Tensor,
        messages: Tensor | None,
        ctx: Inkling2LoopContext,
    ) -> tuple[Tensor, Tensor]:
        """One decoder layer on (x, blocks): the new x and the blocks, with x's input appended at a boundary."""
        received = [x]
        options = {
            "attention_mask": ctx.masks[layer.attention_type],
            "relative_distance": ctx.distances[layer.attention_type],
            "conv_mask": ctx.conv_mask,
            "position_ids": ctx.positions,
        }
        if messages is not None:
            options["messages"] = messages

        def run(y: Tensor) -> Tensor:
            received[0] = y
            return layer(y, blocks, **options)

        out = self._run(site, index, layer, x, run)
        if layer.is_block_boundary:
            blocks = torch.cat([blocks, received[0].unsqueeze(-2)], dim=-2)
        return out, blocks


def _pack(blocks: Tensor, x: Tensor) -> Tensor:
    """(blocks [B, T, n, d], x [B, T, d]) → [B, T, (n + 1)·d]."""
    return torch.cat([blocks, x.unsqueeze(-2)], dim=-2).flatten(-2)


def _unpack(h: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """[B, T, (n + 1)·d] → (blocks [B, T, n, d], x [B, T, d])."""
    stacked = h.unflatten(-1, (-1, d))
    return stacked[..., :-1, :], stacked[..., -1, :]
