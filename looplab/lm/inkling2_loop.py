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

Decoding. :class:`Inkling2LoopDecoding` puts the adapter in the shape the cached decoder reads
(:mod:`looplab.generation.step`): it runs transformers' own layer modules in the order ``step`` does and
gives every decoder-layer call of a loop its own cache entry, so ``per_loop`` holds what the model computes when
it reruns the whole sequence (as transformers' own generate does: Inkling-2's ``cache_offset`` gives each (pass,
layer) its own cache slot). One loop is one pass of layers s..e−1 with message gates (the state packs the block
states; see the adapter). Its attention has per-token relative position biases, sinks, log-scaled queries,
sliding windows and short causal convolutions over time in the key and value projections and after the attention
and the MLP, so each layer runs as transformers' module itself, handed a stand-in for transformers' cache
(:class:`_LayerCalls`) that keeps the call's keys and values and its convolutions' inputs per slot
(:class:`looplab.generation.cache.SlotStore`) and gives back a row's earlier tokens of the same call site.
Policies: ``per_loop`` and ``shared`` (a convolution reads an earlier token's inputs at the loop its keys come
from); ``last_m`` is refused. The logits follow the coda (layers e..L−1): an exit that reads them after every loop
runs the coda on that loop's states, as for any model with coda layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.native import DecodingShape, ModelFamily, NativeLoop, prepare_model, select_rows
from looplab.model.decoding import PASSES, Capabilities

__all__ = ["Inkling2Loop", "Inkling2LoopContext", "Inkling2LoopDecoding"]


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


class Inkling2LoopDecoding(nn.Module):
    """An :class:`Inkling2Loop` in the shape the generation decoder reads (see the module docstring)."""

    #: its own passes, and the cache policies its convolutions' inputs can follow
    capabilities = Capabilities(passes=frozenset(PASSES), policies=("per_loop", "shared"))

    def __init__(self, loop: Inkling2Loop):
        super().__init__()
        self.loop = loop
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=max(config.num_attention_heads, config.swa_num_attention_heads),
            kv_heads=max(config.num_key_value_heads, config.swa_num_key_value_heads),
            d_model=config.hidden_size,
            head_dim=max(config.head_dim, config.swa_head_dim),
            coda_layers=len(loop.coda),
            max_len=config.max_position_embeddings,
            positional="relative",  # a per-token relative bias and log-scaled queries, from the positions
        )
        self.window = config.sliding_window_size
        self.prelude, self.core, self.coda = list(loop.prelude), list(loop.core), list(loop.coda)
        self.positions, self.head = None, loop.lm_head

    def embedding(self, tokens: Tensor) -> Tensor:
        return self.loop.embed(tokens)

    def initial_state(self, e: Tensor) -> Tensor:
        return e  # the pre-loop state, as the adapter's start

    def prelude_pass(self, x: Tensor, calls) -> Tensor:
        """The pre-loop state (blocks_s, x_s) packed [R, m, (n_s + 1)·d] of the embeddings x [R, m, d]."""
        blocks = x.new_zeros(*x.shape[:-1], 0, x.shape[-1])
        for index, layer in enumerate(self.prelude):
            x, blocks = self._layer(calls, index, layer, x, blocks, None)
        return _pack(blocks, x)

    def core_pass(self, h: Tensor, e: Tensor, calls) -> Tensor:
        """One pass through the looped layers from e, with messages from the previous pass h (none on h_0 = e)."""
        d = self.cfg.d_model
        blocks, x = _unpack(e, d)
        previous = None
        if h.shape[-1] != e.shape[-1]:
            previous_blocks, previous_x = _unpack(h, d)
            previous = (previous_blocks[..., self.loop.pre_loop_blocks + 1 :, :], previous_x)
        for index, layer in enumerate(self.core):
            messages = None if previous is None else self.loop.message_input(*previous, index)
            x, blocks = self._layer(calls, index, layer, x, blocks, messages)
        return _pack(blocks, x)

    def coda_pass(self, h: Tensor, calls) -> Tensor:
        blocks, x = _unpack(h, self.cfg.d_model)
        for index, layer in enumerate(self.coda):
            x, blocks = self._layer(calls, index, layer, x, blocks, None)
        return _pack(blocks, x)

    def logits(self, h: Tensor) -> Tensor:
        """Soft-capped logits [..., V] of states h [..., D] after the coda (the adapter's readout, per position)."""
        flat = h.reshape(1, -1, h.shape[-1])  # transformers' block attention reads [B, T, n, d]
        blocks, x = _unpack(flat, self.cfg.d_model)
        loop = self.loop
        x = loop.norm(loop.final_input(blocks, x)[0]).to(loop.embed.weight.dtype)
        return loop.logit_softcap(loop.lm_head(x).float())[0].reshape(*h.shape[:-1], -1)

    def _layer(self, calls, index: int, layer: nn.Module, x: Tensor, blocks: Tensor, messages: Tensor | None):
        """Layer call ``index`` on new tokens (x [R, m, d], blocks [R, m, n, d]): transformers' layer over this
        call's cache entries; a block boundary appends the layer's input x to the blocks."""
        options = {
            "attention_mask": self._mask(calls, layer.attention_type == "sliding_attention", x.dtype),
            "relative_distance": _distances(calls),
            "conv_mask": _conv_mask(calls),
            "cache": _LayerCalls(calls, index),
            "position_ids": calls.positions,
        }
        if messages is not None:
            options["messages"] = messages
        out = layer(x, blocks, **options)
        if layer.is_block_boundary:
            blocks = torch.cat([blocks, x.unsqueeze(-2)], dim=-2)
        return out, blocks

    def _mask(self, calls, sliding: bool, dtype: torch.dtype) -> Tensor:
        """[R, 1, m, S'] additive: the causal mask over real slots (``calls.allowed``), within the sliding
        window (query − key position < window, as transformers' mask) for a sliding layer."""
        allowed = calls.allowed
        if sliding:
            slots, rows, chunk = calls.slots, calls.rows, calls.chunk
            gap = slots.positions[rows, chunk][:, :, None] - slots.positions[rows, None, : chunk.stop]
            allowed = allowed & (gap < self.window)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)


def _distances(calls) -> Tensor:
    """[R, 1, m, S'] long: query position − key position of each new token against every slot (the relative
    bias's distances, per row because a row's slots are not its positions)."""
    slots, rows, chunk = calls.slots, calls.rows, calls.chunk
    return (slots.positions[rows, chunk][:, :, None] - slots.positions[rows, None, : chunk.stop])[:, None]


def _conv_mask(calls) -> Tensor | None:
    """[R, m] the real tokens among the new ones where some are prompt padding (zeroed before a convolution)."""
    real = calls.slots.real[calls.rows, calls.chunk]
    return None if bool(real.all()) else real


class _LayerCalls:
    """transformers' cache, as far as an Inkling-2 layer uses it, over one layer call's entries in the
    decoder's cache: ``update`` writes the new tokens' keys and values and gives back every slot's;
    ``update_conv_state`` stores a convolution's new inputs and gives them back behind the row's k − 1
    earlier tokens' inputs at the same call site (zeros before the first token)."""

    def __init__(self, calls, index: int):
        self.calls, self.index = calls, index

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, **_) -> tuple[Tensor, Tensor]:
        calls = self.calls
        entry = calls.entry(self.index, key_states.shape[1], key_states.shape[-1])
        entry.write(calls.rows, calls.chunk, key_states, value_states, calls.loop)
        return entry.read(calls.rows, calls.chunk, calls.loop)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> None:
        return None  # never the one-token kernel: it keeps a state per batch row, not per row's own tokens

    def update_conv_state(
        self, hidden_states: Tensor, layer_idx: int, state_idx: int = 0, conv_kernel_size: int = 1, **_
    ) -> Tensor:
        """hidden_states [R, C, m] → [R, C, k − 1 + m] (just [R, C, m] for a prefill, whose tokens start at 0)."""
        calls = self.calls
        store = calls.history(self.index, state_idx, hidden_states.shape[1], hidden_states.dtype)
        store.values[calls.rows, calls.chunk] = hidden_states.transpose(1, 2)
        if calls.chunk.start == 0:
            return hidden_states
        return torch.cat([_earlier(calls, store.values, conv_kernel_size - 1), hidden_states], dim=-1)


def _earlier(calls, values: Tensor, count: int) -> Tensor:
    """[R, C, count]: each row's stored values [B, S, C] at the ``count`` positions before its one new token,
    oldest first, zeros before position 0."""
    slots, rows, start = calls.slots, calls.rows, calls.chunk.start
    wanted = calls.positions[:, :1] - torch.arange(count, 0, -1, device=values.device)  # [R, count]
    match = (slots.positions[rows, :start, None] == wanted[:, None]) & slots.real[rows, :start, None]  # [R, S, count]
    slot = match.long().argmax(dim=1)
    picked = values[rows][torch.arange(len(slot), device=values.device)[:, None], slot]  # [R, count, C]
    return (picked * match.any(dim=1)[..., None]).transpose(1, 2)


def _text(config):
    """The text model's config (of the conditional-generation model's, its ``text_config``)."""
    return getattr(config, "text_config", None) or config


FAMILY = ModelFamily(
    name="Inkling-2 loop",
    model_types={
        "inkling2_loop_text": "Inkling2LoopForCausalLM",
        "inkling2_loop": "Inkling2LoopForConditionalGeneration",
    },
    adapter=Inkling2Loop,
    view=Inkling2LoopDecoding,
    native_loops=lambda config: _text(config).loop_num_passes,
    one_loop="one pass through the looped layers, with message gates from the previous pass",
    core_layers=lambda config: _text(config).loop_layer_index_end - _text(config).loop_layer_index_start,
    # every block state the layers can append, plus x
    state_width=lambda config: (
        (_text(config).num_hidden_layers // max(1, _text(config).n_layers_per_attn_res_block) + 2)
        * _text(config).hidden_size
    ),  # fmt: skip
)
