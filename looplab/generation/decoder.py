"""The cached decoder behind :func:`looplab.generation.decode.generate`: a prefill, then one token per row
per step, each token's loops run until its exit, reading and extending the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.generation.cache import KVCache, LayerCache, Slots, cached_attention, visible
from looplab.generation.retrofit import RetrofitDecoding
from looplab.generation.sampling import Generation, choose, ended
from looplab.model.attention import rope_tables
from looplab.model.layer import Layer
from looplab.tasks.base import PAD


@dataclass
class _Prompt:
    """The prompts' states h, e [B, W, d], row b after ``depth[b]`` loops ([B] long; ``shallowest`` its
    minimum), with their attention mask [B, W, W] and RoPE tables."""

    h: Tensor
    e: Tensor
    allowed: Tensor
    rope: tuple[Tensor, Tensor] | None
    depth: Tensor
    shallowest: int


class Decoder:
    """One generation with a KV cache (see :func:`generate`)."""

    def __init__(
        self, model, prompts, max_new_tokens, exit_rule, policy, sampling, finished, keep_loops=2, forced=None
    ):
        self.model, self.exit, self.sampling, self.finished = model, exit_rule, sampling, finished
        self.forced = forced
        self.max_new = max_new_tokens
        cfg = model.cfg
        device, dtype = model.head.weight.device, model.head.weight.dtype
        self.lengths = torch.tensor([len(p) for p in prompts], device=device)
        self.width = int(self.lengths.max())
        slots = self.width + max_new_tokens
        batch = len(prompts)
        self.tokens = torch.full((batch, self.width), PAD, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, device=device)
        positions = torch.arange(slots, device=device).expand(batch, slots).clone()
        real = positions < self.lengths[:, None]
        self.slots = Slots(positions, real)
        head_dim = getattr(cfg, "head_dim", cfg.d_model // cfg.n_heads)
        kv_heads = getattr(cfg, "kv_heads", cfg.n_heads)  # a retrofit's grouped keys and values
        self.cache = KVCache(policy, batch, kv_heads, head_dim, self.slots, dtype, device, keep_loops)
        self.rope = None
        if cfg.positional == "rope":
            length = int(self.lengths.max()) + max_new_tokens
            if isinstance(model, RetrofitDecoding):  # the pretrained model's own rotary tables
                self.rope = model.rope_tables(length, device, dtype)
            else:
                self.rope = rope_tables(length, head_dim, cfg.rope_base, device, dtype)
        self.generator = torch.Generator().manual_seed(sampling.seed)
        # per_loop with an adaptive exit runs the prompt only as deep as its tokens need, and deepens it
        # when a later token first reaches a loop it has not run (its keys and values are the same
        # whenever they are computed). A coda would read the prompt's states at that depth, not the cap.
        self.lazy_prompt = policy == "per_loop" and exit_rule.adaptive and not cfg.coda_layers
        self.prompt: _Prompt | None = None

    def run(self) -> Generation:
        batch = len(self.lengths)
        rows = torch.arange(batch, device=self.lengths.device)
        logits, depths = self.forward(self.tokens, rows, slice(0, self.width), self.lengths - 1, prefill=True)
        out = Generation(*([[] for _ in range(batch)] for _ in range(3)))
        live = rows
        for step in range(self.max_new):
            chosen = choose(logits, live.tolist(), step, self.forced, self.sampling, self.generator)
            logprobs = logits.double().log_softmax(-1).gather(1, chosen[:, None]).squeeze(1).tolist()
            still = []
            for i, row in enumerate(live.tolist()):
                out.tokens[row].append(int(chosen[i]))
                out.depths[row].append(int(depths[i]))
                out.logprobs[row].append(logprobs[i])
                if not ended(out.tokens[row], row, self.finished, self.forced):
                    still.append(i)
            if step == self.max_new - 1 or not still:
                break
            keep = torch.tensor(still, device=live.device)
            live, chosen = live[keep], chosen[keep]
            slot = self.width + step
            self.slots.positions[live, slot] = self.lengths[live] + step
            self.slots.real[live, slot] = True
            logits, depths = self.forward(chosen[:, None], live, slice(slot, slot + 1), torch.zeros_like(live))
        out.cache_bytes = self.cache.nbytes()
        return out

    def forward(
        self, tokens: Tensor, rows: Tensor, chunk: slice, query: Tensor, prefill: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Run new tokens [R, m] of ``rows`` in slots ``chunk``; read each row's position ``query`` [R].

        The ``prefill`` (the prompts) runs every token to the cap (later tokens need each loop's
        keys and values; with ``lazy_prompt`` only until every row's query token has exited, and
        :meth:`deepen_prompt` runs the rest when a later token needs it) and reads the query
        position at its exit; a decode step (m = 1) drops a row from the loop as soon as its token
        exits. Returns next-token logits [R, V] and exit depths [R].
        """
        model, window = self.model, self.model.cfg.attention_window
        count = len(rows)
        every_row = count == len(self.lengths)  # rows are 0..B−1: index the cache by slices, not gathers
        positions = self.slots.positions[rows, chunk]
        rope = None if self.rope is None else (self.rope[0][positions], self.rope[1][positions])
        key = slice(None) if every_row else rows
        allowed = visible(self.slots, key, chunk, window)
        x = model.embedding(tokens)
        if model.positions is not None:
            x = x + model.positions.weight[positions]
        for index, layer in enumerate(model.prelude):
            x = self.layer(layer, x, key, chunk, self.cache.layer("prelude", 0, index), allowed, rope)
        e = x
        h = model.initial_state(e)
        picks = torch.arange(count, device=rows.device)
        read = h[picks, query]  # [R, d] the query position's state at its exit
        depth = torch.zeros(count, dtype=torch.long, device=rows.device)
        running = torch.ones(count, dtype=torch.bool, device=rows.device)
        active, logp_prev = picks, None
        for t in range(1, self.exit.loops + 1):
            if not prefill and self.prompt is not None and t > self.prompt.shallowest:
                self.deepen_prompt(rows[active], t)
            everyone = len(active) == count
            sub_key = key if everyone else rows[active]
            sub_allowed = allowed if everyone else allowed[active]
            sub_rope = rope if rope is None or everyone else (rope[0][active], rope[1][active])
            xa = model.core_input(h if everyone else h[active], e if everyone else e[active])
            for index, layer in enumerate(model.core):
                cache = self.cache.layer("core", t, index)
                xa = self.layer(layer, xa, sub_key, chunk, cache, sub_allowed, sub_rope, t)
            if model.core_out_norm is not None:
                xa = model.core_out_norm(xa)
            h_prev_query = h[active, query[active]]
            if everyone:
                h = xa
            else:
                h = h.clone()
                h[active] = xa
            h_query = xa[torch.arange(len(active), device=rows.device), query[active]]
            logp = model.head(model.final_norm(h_query)).log_softmax(-1) if self.exit.reads_logits else None
            stop = self.exit.stop(t, h_query, h_prev_query, logp, None if logp_prev is None else logp_prev[active])
            stop = stop & running[active]
            stopping = active[stop]
            read[stopping] = h_query[stop]
            depth[stopping] = t
            running[stopping] = False
            if not prefill and len(stopping) and t < self.exit.loops:
                self.cache.lend(rows[stopping], chunk, t, self.exit.loops, len(model.core))
            if logp is not None:
                logp_prev = torch.zeros(count, logp.shape[-1], dtype=logp.dtype, device=logp.device)
                logp_prev[active] = logp
            if prefill and not self.lazy_prompt:  # every loop's keys and values of the prompt are needed
                continue
            if not running.any():
                break
            active = running.nonzero(as_tuple=True)[0]
        if prefill and self.lazy_prompt:  # each row's prompt stands at its query token's exit depth
            self.prompt = _Prompt(h, e, allowed, rope, depth.clone(), int(depth.min()))
        final = h.clone()
        final[picks, query] = read
        for index, layer in enumerate(model.coda):
            final = self.layer(layer, final, key, chunk, self.cache.layer("coda", 0, index), allowed, rope)
        return model.head(model.final_norm(final[picks, query])), depth

    def deepen_prompt(self, rows: Tensor, loop: int) -> None:
        """Run the prompt tokens of those ``rows`` whose prompt stands below ``loop`` up to it, writing
        their keys and values (a prompt token attends only to its row's prompt, so these are exact)."""
        prompt, model, chunk = self.prompt, self.model, slice(0, self.width)
        need = rows[prompt.depth[rows] < loop]
        if len(need):
            for t in range(int(prompt.depth[need].min()) + 1, loop + 1):
                sub = need[prompt.depth[need] < t]
                rope = None if prompt.rope is None else (prompt.rope[0][sub], prompt.rope[1][sub])
                x = model.core_input(prompt.h[sub], prompt.e[sub])
                for index, layer in enumerate(model.core):
                    cache = self.cache.layer("core", t, index)
                    x = self.layer(layer, x, sub, chunk, cache, prompt.allowed[sub], rope, t)
                prompt.h[sub] = x if model.core_out_norm is None else model.core_out_norm(x)
                prompt.depth[sub] = t
        prompt.shallowest = int(prompt.depth.min())

    def layer(self, layer: Layer, x: Tensor, rows, chunk: slice, cache: LayerCache, allowed, rope, loop=0) -> Tensor:
        """One layer on new tokens x [R, m, d] at core ``loop`` (0 outside the core), its attention
        reading and extending ``cache``."""
        x = layer.attn_residual(x, lambda y: cached_attention(layer.attn, y, rows, chunk, cache, allowed, rope, loop))
        return layer.mlp_residual(x, layer.mlp)
