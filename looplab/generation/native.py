"""Generation from transformers' native looped LMs: HRM-Text (:class:`looplab.lm.hrm_text.HrmTextLoop`)
and Inkling-2's looped text model (:class:`looplab.lm.inkling2_loop.Inkling2Loop`), in the shape the
cached decoder reads (:mod:`looplab.generation.decoder`: embedding, the three passes, logits).

Each view runs transformers' own layer modules, in the order the adapter's ``step`` does, and
gives every decoder-layer call of a loop its own cache entry, so ``per_loop`` holds what the model
computes when it reruns the whole sequence (transformers' own generate does the same: HRM-Text's
``cycle_offset`` and Inkling-2's ``cache_offset`` give each (pass, layer) its own cache slot).

HRM-Text   one loop is one H cycle: L_cycles passes of the L stack, then the H stack, on the state
           h = [z_H | z_L]. Its layers are Llama-like pre-norm layers whose attention (full heads, no
           q/k norm, RoPE, scale head_dim^-½) gates its output with sigmoid(gate_proj(x)) before
           o_proj; :func:`looplab.generation.cache.cached_attention` runs them. Call index
           c·n + ℓ is L-stack layer ℓ in L pass c, L_cycles·n + ℓ is H-stack layer ℓ. The next-token
           logits are lm_head(z_H), so every exit applies, the logit-reading ones included.
Inkling-2  one loop is one pass of layers s..e−1 with message gates (the state packs the block
           states; see the adapter). Its attention has per-token relative position biases, sinks,
           log-scaled queries, sliding windows and short causal convolutions over time in the key
           and value projections and after the attention and the MLP, so each layer runs as
           transformers' module itself, handed a stand-in for transformers' cache
           (:class:`_LayerCalls`) that keeps the call's keys and values and its convolutions'
           inputs per slot (:class:`looplab.generation.cache.SlotStore`) and gives back a row's
           earlier tokens of the same call site. Policies: ``per_loop`` and ``shared`` (a
           convolution reads an earlier token's inputs at the loop its keys come from);
           ``last_m`` is refused. The logits follow the coda (layers e..L−1), so the exits that
           read logits after every loop are refused, as for any model with coda layers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from looplab.generation.retrofit import DecodingShape, LlamaLayerView, rotary_tables
from looplab.lm.hrm_text import HrmTextLoop
from looplab.lm.inkling2_loop import Inkling2Loop, _pack, _unpack

__all__ = ["HrmTextDecoding", "Inkling2LoopDecoding"]


class HrmTextDecoding(nn.Module):
    """An :class:`HrmTextLoop` in the shape the generation decoder reads (see the module docstring)."""

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


class Inkling2LoopDecoding(nn.Module):
    """An :class:`Inkling2Loop` in the shape the generation decoder reads (see the module docstring)."""

    #: the cache policies its convolutions' inputs can follow
    policies = ("per_loop", "shared")

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
