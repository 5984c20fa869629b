"""Autoregressive generation from a causal looped transformer, with a KV cache and a depth per token.

:func:`generate` takes a batch of prompts of different lengths (token ids), runs
them through the model once (the prefill, every prompt token to the exit's cap),
then one token per row per step. Each step runs the new token's loops until the
exit rule (:mod:`looplab.generation.exits`) stops it, reads the next-token
distribution from that state, and picks the next token (greedy, or sampled with
a temperature and top-k from a seeded generator). Rows whose token has stopped
leave the step, so a step costs the sum of its tokens' depths, not the batch
times the deepest. The cache policy (:mod:`looplab.generation.cache`) decides
which earlier keys and values a token reads; ``none`` recomputes the whole
sequence at every step instead (the reference the cached paths are tested
against; fixed depth only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.generation.cache import POLICIES, KVCache, LayerCache, Slots, cached_attention, visible
from looplab.generation.exits import ExitRule
from looplab.generation.retrofit import RetrofitDecoding, decodable
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model import LoopedTransformer
from looplab.model.attention import rope_tables
from looplab.model.layer import Layer
from looplab.tasks.base import PAD


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy when ``temperature`` is 0, else sampled from
    softmax(logits / temperature) over the ``top_k`` most likely tokens (0: all), drawn from a
    generator seeded with ``seed``."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise LooplabError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise LooplabError(f"top-k must be >= 0 (0 = every token), got {self.top_k}")


@dataclass
class Generation:
    """What :func:`generate` returns, per row: the new token ids, the loops each was read after, and
    each token's log-probability under the distribution it was read from (before any temperature)."""

    tokens: list[list[int]] = field(default_factory=list)
    depths: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    cache_bytes: int = 0

    @property
    def mean_depth(self) -> float:
        """Mean loops per generated token over every row (NaN when nothing was generated)."""
        flat = [d for row in self.depths for d in row]
        return sum(flat) / len(flat) if flat else float("nan")

    @property
    def mean_loss(self) -> float:
        """Mean −log p of the tokens over every row: the loss of a :func:`score` (NaN when empty)."""
        flat = [lp for row in self.logprobs for lp in row]
        return -sum(flat) / len(flat) if flat else float("nan")


#: the defaults of :func:`generate`: greedy decoding at a fixed 4 loops
GREEDY = Sampling()
FIXED_EXIT = ExitRule()


@torch.no_grad()
def generate(
    model: LoopedTransformer | RetrofittedLoop,
    prompts: list[list[int]],
    max_new_tokens: int,
    exit_rule: ExitRule = FIXED_EXIT,
    cache: str = "per_loop",
    sampling: Sampling = GREEDY,
    finished: Callable[[list[int]], bool] | None = None,
    keep_loops: int = 2,
    forced: list[list[int]] | None = None,
) -> Generation:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a causal looplab model, or a retrofitted pretrained LM (:mod:`looplab.generation.retrofit`).
        prompts: token ids per row (each non-empty; the task's start token first, as in training).
        exit_rule: the depth of each new token (``fixed``: ``exit_rule.loops`` for every token).
        cache: ``per_loop``, ``shared``, ``last_m`` (each token's last ``keep_loops`` loops) or
            ``none`` (recompute every step; fixed exit only).
        finished: called with a row's generated ids after each token; True ends that row.
        forced: the tokens each row takes instead of picking one (teacher forcing, for
            :func:`score`); a row ends with its forced tokens.
    """
    model = decodable(model)
    _check(model, prompts, max_new_tokens, exit_rule, cache, keep_loops, forced)
    was_training = model.training
    model.eval()
    try:
        if cache == "none":
            return _generate_uncached(model, prompts, max_new_tokens, exit_rule.loops, sampling, finished, forced)
        decoder = _Decoder(model, prompts, max_new_tokens, exit_rule, cache, sampling, finished, keep_loops, forced)
        return decoder.run()
    finally:
        model.train(was_training)


def score(
    model: LoopedTransformer | RetrofittedLoop,
    sequences: list[list[int]],
    exit_rule: ExitRule = FIXED_EXIT,
    cache: str = "per_loop",
    context: int = 1,
    keep_loops: int = 2,
) -> Generation:
    """Teacher-forced decoding: each row's first ``context`` tokens are its prompt, and every later
    token is fed as if generated, read at the depth its exit chooses; ``logprobs`` are then the
    per-token log-likelihoods of the text (``mean_loss`` its loss in nats per token)."""
    if context < 1 or any(len(row) <= context for row in sequences):
        raise LooplabError(f"every scored sequence needs more than its {context} context token(s)")
    forced = [row[context:] for row in sequences]
    prompts = [row[:context] for row in sequences]
    return generate(model, prompts, max(map(len, forced)), exit_rule, cache, keep_loops=keep_loops, forced=forced)


def _check(model: LoopedTransformer, prompts, max_new_tokens: int, exit_rule: ExitRule, cache: str, keep_loops, forced):
    cfg = model.cfg
    if not cfg.causal:
        raise LooplabError(
            "generation needs a causal model (model.causal = true): this one sees the tokens it predicts"
        )
    if cfg.recurrence != "standard":
        raise LooplabError(
            f"generation caches one key and value per core layer and loop; model.recurrence = {cfg.recurrence!r} "
            "runs the core several times a loop: valid choices: standard"
        )
    if cfg.init_state == "noise" and cfg.injection != "none":
        raise LooplabError("generation does not support init_state = 'noise' (each token would need its own draw)")
    if cache not in (*POLICIES, "none"):
        raise LooplabError(f"unknown KV cache policy {cache!r}; valid choices: {', '.join((*POLICIES, 'none'))}")
    if cache == "last_m" and keep_loops < 1:
        raise LooplabError(f"the last_m cache keeps >= 1 loops per token, got {keep_loops}")
    if forced is not None and (len(forced) != len(prompts) or any(len(row) == 0 for row in forced)):
        raise LooplabError(f"forced tokens must be given for each of the {len(prompts)} prompts, at least one each")
    if cache == "none" and exit_rule.name != "fixed":
        raise LooplabError("recomputing without a cache reads every token at one depth: use the fixed exit")
    if exit_rule.name == "halting" and exit_rule.halts is None:
        raise LooplabError("the halting exit needs the run's halting head (a run trained with a halting schedule)")
    if exit_rule.reads_logits and cfg.coda_layers:
        raise LooplabError(
            f"the {exit_rule.name} exit reads the logits after every loop; with coda layers it is not supported"
        )
    if not prompts or any(len(p) == 0 for p in prompts):
        raise LooplabError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise LooplabError(f"max new tokens must be >= 1, got {max_new_tokens}")
    vocab = model.head.out_features
    if any(not 0 <= token < vocab for row in (*prompts, *(forced or [])) for token in row):
        raise LooplabError(f"token ids must be in 0..{vocab - 1} (the model's vocabulary)")
    longest = max(len(p) for p in prompts) + max_new_tokens
    if cfg.positional == "learned" and longest > cfg.max_len:
        raise LooplabError(f"prompt plus new tokens ({longest}) exceed model.max_len {cfg.max_len} (learned positions)")


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


def _pick(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> Tensor:
    """[R] next tokens from logits [R, V]."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1).cpu(), 1, generator=generator).squeeze(1).to(logits.device)


class _Decoder:
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
        self.lazy_prompt = policy == "per_loop" and exit_rule.name != "fixed" and not cfg.coda_layers
        self.prompt: _Prompt | None = None

    def run(self) -> Generation:
        batch = len(self.lengths)
        rows = torch.arange(batch, device=self.lengths.device)
        logits, depths = self.forward(self.tokens, rows, slice(0, self.width), self.lengths - 1, prefill=True)
        out = Generation(*([[] for _ in range(batch)] for _ in range(3)))
        live = rows
        for step in range(self.max_new):
            chosen = _choose(logits, live.tolist(), step, self.forced, self.sampling, self.generator)
            logprobs = logits.double().log_softmax(-1).gather(1, chosen[:, None]).squeeze(1).tolist()
            still = []
            for i, row in enumerate(live.tolist()):
                out.tokens[row].append(int(chosen[i]))
                out.depths[row].append(int(depths[i]))
                out.logprobs[row].append(logprobs[i])
                if not _ended(out.tokens[row], row, self.finished, self.forced):
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


def _choose(logits: Tensor, rows: list[int], step: int, forced, sampling: Sampling, generator) -> Tensor:
    """[R] the next token of each live row: its forced token at ``step``, or one picked from its logits."""
    if forced is None:
        return _pick(logits, sampling, generator)
    return torch.tensor([forced[row][step] for row in rows], dtype=torch.long, device=logits.device)


def _ended(tokens: list[int], row: int, finished, forced) -> bool:
    """Whether a row is done after its latest token: its forced tokens used up, or ``finished`` says so."""
    if forced is not None:
        return len(tokens) == len(forced[row])
    return bool(finished and finished(tokens))


def _generate_uncached(model, prompts, max_new_tokens, loops, sampling, finished, forced) -> Generation:
    """Recompute every row's whole sequence at ``loops`` loops for every new token (the reference)."""
    device = model.head.weight.device
    generator = torch.Generator().manual_seed(sampling.seed)
    sequences = [list(p) for p in prompts]
    out = Generation(*([[] for _ in prompts] for _ in range(3)))
    live = list(range(len(prompts)))
    for step in range(max_new_tokens):
        lengths = torch.tensor([len(sequences[r]) for r in live], device=device)
        tokens = torch.full((len(live), int(lengths.max())), PAD, dtype=torch.long, device=device)
        for i, row in enumerate(live):
            tokens[i, : len(sequences[row])] = torch.tensor(sequences[row], device=device)
        valid = torch.arange(tokens.shape[1], device=device)[None, :] < lengths[:, None]
        logits = model(tokens, valid, loops)[torch.arange(len(live), device=device), lengths - 1]
        chosen = _choose(logits, live, step, forced, sampling, generator)
        logprobs = logits.double().log_softmax(-1).gather(1, chosen[:, None]).squeeze(1).tolist()
        still = []
        for i, row in enumerate(live):
            token = int(chosen[i])
            sequences[row].append(token)
            out.tokens[row].append(token)
            out.depths[row].append(loops)
            out.logprobs[row].append(logprobs[i])
            if not _ended(out.tokens[row], row, finished, forced):
                still.append(row)
        live = still
        if not live:
            break
    return out
