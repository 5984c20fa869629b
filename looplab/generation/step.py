"""The ``step`` decoder, the cached decoder behind :func:`looplab.generation.entry.generate` that the others
build on: a prefill, then one token per row per step, each token's loops run until its exit, reading and
extending the KV cache through the passes of :mod:`looplab.generation.passes` (what it reads of a model: that
module's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.generation.cache import KVCache, Slots, kv_shape, visible
from looplab.generation.decoders import DecodingMethod, register_decoder
from looplab.generation.lazy_prompt import LazyPrompt, RunningQueries
from looplab.generation.passes import Calls, coda_pass, core_pass, fused_core_pass, logits_of, prelude_pass
from looplab.generation.row_exits import RowExits
from looplab.generation.sampling import Generation, choose, ended
from looplab.model.attention import rope_tables
from looplab.params import param
from looplab.tasks.base import PAD
from looplab.token_exits import Carried

#: a decode step's loop runs every row of the step, masking the cache writes of rows whose token has
#: exited, while at least this fraction of them still runs; below it, it gathers the running rows
#: (measured in bench/row_selection.py: at d 64 the two cost the same; at d 256 masks lose up to 21 % where
#: most rows have exited, and win up to 3 % where nearly all run)
MASK_AT = 0.75


class Decoder:
    """One generation with a KV cache (see :func:`generate`): the ``step`` decoder, and the prefill, passes and
    cache the other cached decoders build on. ``options``: a checked
    :class:`~looplab.generation.options.DecodeOptions` (its exit, cache and sampling are read here).

    ``exits`` (one per prompt), where given, lets each row stop by an exit of its own up to a cap of its own
    (:class:`~looplab.generation.row_exits.RowExits`), and ``cap`` makes room for deeper rows admitted later
    (:meth:`place`): the server's shared batches. With a ``pool`` its keys and values are paged there
    (:meth:`KVCache.page <looplab.generation.cache.KVCache.page>`): each forward pass first takes the blocks its
    slots need (:meth:`KVCache.reserve <looplab.generation.cache.KVCache.reserve>`)."""

    #: a lazy prefill stops after its first loop, its query tokens that run on handed to the decoder's later
    #: calls (:attr:`handed`: the depth-wise decoder runs each as a token in flight, its prompt's loops its own)
    HANDS_ON = False

    def __init__(
        self, model, prompts, max_new_tokens, options, finished=None, forced=None, width=0, exits=None, cap=0, pool=None
    ):
        exit_rule, policy = options.exit_rule, options.cache
        self.model, self.exit, self.sampling, self.finished = model, exit_rule, options.sampling, finished
        # rows of a shared batch may each stop by an exit of their own, up to a cap of their own (``exits``, one
        # per prompt; later rows' by :meth:`place`): the loop runs to the largest cap any row may hold
        self.mixed = mixed = exits is not None  # rows' exits may differ, now or once later rows are admitted
        exits = list(exits) if mixed else [exit_rule] * len(prompts)
        self.cap = max(cap, *(rule.loops for rule in exits))
        # the step decoder's read-only exit runs every token to the cap and reads it at its exit (writes every
        # loop's keys); the decoders built on this class have no such parameter
        params = options.decoder_params
        self.read_only = read_only = isinstance(params, StepParams) and params.read_only_exit
        self.forced = forced
        self.max_new = max_new_tokens
        cfg = model.cfg
        device = model.head.weight.device
        kv_heads, head_dim, dtype = kv_shape(model)
        self.lengths = torch.tensor([len(p) for p in prompts], device=device)
        self.exits = RowExits(exits, device)
        self.width = max(int(self.lengths.max()), width)  # more when later prompts will take over rows
        slots = self.width + max_new_tokens
        batch = len(prompts)
        self.tokens = torch.full((batch, self.width), PAD, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, device=device)
        positions = torch.arange(slots, device=device).expand(batch, slots).clone()
        real = positions < self.lengths[:, None]
        self.slots = Slots(positions, real)
        self.cache = KVCache(
            policy, batch, kv_heads, head_dim, self.slots, dtype, device, options.cache_params, self.cap
        )
        if pool is not None:
            self.cache.page(pool, len(model.prelude), len(model.core), len(model.coda))
            self.cache.assign(torch.arange(batch, device=device), self.exits.caps)
        self.rope = None
        if cfg.positional == "rope":
            length = self.width + max_new_tokens
            if model.capabilities.rope:  # a pretrained model's own rotary tables
                self.rope = model.rope_tables(length, device, dtype)
            else:
                self.rope = rope_tables(length, head_dim, cfg.rope_base, device, dtype)
        self.generator = torch.Generator().manual_seed(options.sampling.seed)
        # per_loop with an adaptive exit runs the prompt only as deep as its tokens need, and deepens it
        # when a later token first reaches a loop it has not run (its keys and values are the same
        # whenever they are computed). A coda would read the prompt's states at that depth, not the cap.
        per_loop = options.policy.per_loop
        adaptive = exit_rule.adaptive or mixed  # some rows may stop before others
        self.lazy_prompt = per_loop and adaptive and not cfg.coda_layers and not read_only
        # a decode step may run its exited rows too, their cache writes masked (MASK_AT), where the model's
        # layers are chains of pre-norm layers (whose attention takes the mask) and per_loop keeps every loop
        self.masks = per_loop and adaptive and model.capabilities.chains and not read_only
        self.prompt: LazyPrompt | None = None
        #: the query tokens the latest prefill handed on (HANDS_ON), until the caller takes them
        self.handed: RunningQueries | None = None

    def run(self) -> Generation:
        batch = len(self.lengths)
        rows = torch.arange(batch, device=self.lengths.device)
        logits, depths = self.prefill(rows)
        out = Generation(*([[] for _ in range(batch)] for _ in range(3)))
        live = rows
        for step in range(self.max_new):
            chosen = choose(logits, live.tolist(), step, self.forced, self.sampling, self.generator)
            logprobs = logits.double().log_softmax(-1).gather(1, chosen[:, None]).squeeze(1).tolist()
            still = []
            for i, row in enumerate(live.tolist()):
                out.record(row, int(chosen[i]), int(depths[i]), logprobs[i])
                if not ended(out.tokens[row], row, self.finished, self.forced):
                    still.append(i)
            if step == self.max_new - 1 or not still:
                break
            keep = torch.tensor(still, device=live.device)
            live, chosen = live[keep], chosen[keep]
            logits, depths = self.step(live, chosen, self.width + step, self.lengths[live] + step)
        out.cache_bytes = self.cache.nbytes()
        return out

    def prefill(self, rows: Tensor, start: int = 0, full: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Run the prompts of ``rows`` [R] to the cap (as deep as their tokens need, with a lazy prompt, but for
        the ``full`` [R] rows): their next-token logits [R, V] and the depths [R] their last tokens exited at
        (but for the rows a lazy prefill of :attr:`HANDS_ON` hands on: :meth:`forward`). ``start``: the slots
        before it already hold these rows' keys and values (a cached prefix)."""
        # a lazy prompt stands at the whole width (later rows take its place); otherwise the prompt slots past
        # these rows' longest prompt are padding, not run (a row admitted into a wide batch costs its own length)
        width = self.width if self.lazy_prompt else int(self.lengths[rows].max())
        tokens, query = self.tokens[rows, start:width], self.lengths[rows] - 1 - start
        return self.forward(tokens, rows, slice(start, width), query, prefill=True, full=full)

    def place(self, rows: Tensor, prompts: list[list[int]], exits=None, shared: Tensor | None = None) -> None:
        """Put a new prompt in each of ``rows`` [R] (its tokens, length and slots replace the row's) and, where
        given, an exit of its own; ``shared`` [R] bool: rows whose paged per-loop cache keeps one store across
        loops (:meth:`KVCache.assign <looplab.generation.cache.KVCache.assign>`; their prompts then run to
        their caps at once). Nothing runs: a cached prefix may be put in place next (``cache.fill_slots``)."""
        device = self.lengths.device
        if exits is not None:
            self.exits.set(rows.tolist(), exits)
        self.cache.assign(rows, self.exits.caps[rows], shared)
        self.tokens[rows] = PAD
        for row, prompt in zip(rows.tolist(), prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, device=device)
        self.lengths[rows] = torch.tensor([len(prompt) for prompt in prompts], device=device)
        slots = torch.arange(self.slots.positions.shape[1], device=device)
        self.slots.positions[rows] = slots
        self.slots.real[rows] = slots[None, :] < self.lengths[rows][:, None]  # an earlier occupant's tokens go

    def enter(self, rows: Tensor, start: int = 0, full: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Prefill the prompts :meth:`place` put in ``rows`` [R] while the other rows keep their place and their
        lazy prompts — from slot ``start`` on, the keys and values before it in place; ``full`` as
        :meth:`prefill` takes it (a row sharing one store across loops is always full). Returns what
        :meth:`prefill` returns for them."""
        shared = self.cache.loop_shared
        if self.lazy_prompt and shared is not None and bool(shared[rows].any()):
            full = shared[rows] if full is None else full | shared[rows]
        earlier = self.prompt
        logits, depths = self.prefill(rows, start, full)
        if self.prompt is not None:  # the other rows' lazy prompts stand (free rows' at the cap); these rows' are new
            fresh = self.prompt
            self.prompt = earlier if earlier is not None else LazyPrompt.free(fresh, len(self.lengths), self.cap)
            self.prompt.take(rows, fresh)
        return logits, depths

    def start(self, rows: Tensor, slot: Tensor | int, positions: Tensor) -> None:
        """Put a new token of each of ``rows`` [R] in ``slot`` (one for all, or [R]), at its own position in its
        row ([R]: the row's token count before it): from here on it is a real token the later ones attend to."""
        self.slots.positions[rows, slot] = positions
        self.slots.real[rows, slot] = True

    def step(self, rows: Tensor, tokens: Tensor, slot: int, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Start one new token per row (``tokens`` [R]) in ``slot`` and run it to its exit: its next-token logits
        [R, V] and exit depths [R] (what the step decoder and the server's scheduler run each step)."""
        self.start(rows, slot, positions)
        return self.forward(tokens[:, None], rows, slice(slot, slot + 1), torch.zeros_like(rows))

    def forward(
        self,
        tokens: Tensor,
        rows: Tensor,
        chunk: slice,
        query: Tensor,
        prefill: bool = False,
        full: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Run new tokens [R, m] of ``rows`` in slots ``chunk``; read each row's position ``query`` [R].

        The ``prefill`` (the prompts) runs every token to the cap (later tokens need each loop's
        keys and values; with ``lazy_prompt`` only until every row's query token has exited, but for
        the ``full`` [R] rows, and :meth:`core_call` runs the rest when a later token needs it) and
        reads the query position at its exit; a decode step (m = 1) drops a row from the loop as soon as
        its token exits. Returns next-token logits [R, V] and exit depths [R]. With :attr:`HANDS_ON` and no
        ``full`` row a lazy prefill stops after loop 1: the rows whose query token runs on are :attr:`handed`
        on (their logits and depths here are not theirs yet).
        """
        model, window = self.model, self.model.cfg.attention_window
        self.cache.reserve(rows, chunk)  # a paged cache's blocks for these slots, before anything runs
        count = len(rows)
        if prefill:
            self.handed = None
        # rows are 0..B−1 in order: index the cache by slices, not gathers (a server's batch holds its rows in the
        # order they joined, which may be another order of all of them)
        every_row = count == len(self.lengths) and bool((rows == torch.arange(count, device=rows.device)).all())
        positions = self.slots.positions[rows, chunk]
        rope = None if self.rope is None else (self.rope[0][positions], self.rope[1][positions])
        key = slice(None) if every_row else rows
        allowed = visible(self.slots, key, chunk, window)
        x = model.embedding(tokens)
        if model.positions is not None:
            x = x + model.positions.weight[positions]
        e = prelude_pass(model, x, Calls(self, "prelude", 0, key, chunk, allowed, rope))
        h = model.initial_state(e)
        picks = torch.arange(count, device=rows.device)
        read = None  # [R, d_h] the query position's state at its exit (h_0 may be narrower than a loop's state)
        depth = torch.zeros(count, dtype=torch.long, device=rows.device)
        running = torch.ones(count, dtype=torch.bool, device=rows.device)
        active, logp_prev = picks, None
        carried = Carried(count, rows.device)  # what each row's exit carries across this token's checks
        reads_logits = self.exits.reads_logits(rows)
        for t in range(1, self.cap + 1):
            # the rows whose lazy prompt may stand below loop t (run in this loop's core call)
            behind = rows[active] if not prefill and self.prompt is not None and t > self.prompt.shallowest else None
            # every row runs: all of them, or (masked) also those that exited, whose writes are masked out
            everyone = len(active) == count
            whole = everyone or (not prefill and self.masks and len(active) >= MASK_AT * count)
            run, keep = (picks, None if everyone else running) if whole else (active, None)
            sub_key = key if whole else rows[active]
            sub_allowed = allowed if whole else allowed[active]
            sub_rope = rope if rope is None or whole else (rope[0][active], rope[1][active])
            calls = Calls(self, "core", t, sub_key, chunk, sub_allowed, sub_rope, keep)
            xa = self.core_call(h if whole else h[active], e if whole else e[active], calls, behind, t)
            h_prev_query = h[run, query[run]]
            if whole:  # an exited row's state is its ``read`` (a decode step has one token per row)
                h = xa
            else:
                h = h.clone()
                h[active] = xa
            h_query = xa[torch.arange(len(run), device=rows.device), query[run]]
            if read is None:
                read = h_query.clone()
            logp = None
            if reads_logits and model.cfg.coda_layers:
                # the logits follow the coda: run it on this loop's states, the earlier tokens' coda entries
                # being their exits' (the final coda pass below writes this token's)
                coda = coda_pass(model, xa, Calls(self, "coda", 0, sub_key, chunk, sub_allowed, sub_rope, keep))
                logp = logits_of(model, coda[torch.arange(len(run), device=rows.device), query[run]]).log_softmax(-1)
            elif reads_logits:
                logp = logits_of(model, h_query).log_softmax(-1)
            prev_run = None if logp_prev is None else logp_prev[run]
            stop = self.exits.check(rows[run], t, h_query, h_prev_query, logp, prev_run, carried, run)
            stop = stop & running[run]
            stopping = run[stop]
            read[stopping] = h_query[stop]
            depth[stopping] = t
            running[stopping] = False
            if not prefill and len(stopping) and not self.read_only:
                self.lend(rows[stopping], chunk, t)
            if logp is not None:
                logp_prev = torch.zeros(count, logp.shape[-1], dtype=logp.dtype, device=logp.device)
                logp_prev[run] = logp
            if self.read_only:  # every row runs every loop
                continue
            if prefill and not self.lazy_prompt:  # every row's prompt runs every loop up to its row's cap
                if self.mixed:  # (a coda reads the prompt's states at the row's cap, not a deeper row's)
                    active = picks[self.exits.caps[rows] > t]
                    if not len(active):
                        break
                continue
            going = running if full is None else running | (full & (self.exits.caps[rows] > t))
            if not going.any():
                break
            if prefill and self.HANDS_ON and full is None:  # (loop 1 ran every row: ``run`` is every row)
                on = running.clone()
                ran = None if logp is None else logp[on]
                self.handed = RunningQueries(on, h_query[on], ran, carried)
                depth = torch.where(on, t, depth)  # where their prompts stand
                break
            active = going.nonzero(as_tuple=True)[0]
        if prefill and self.lazy_prompt:  # each row's prompt stands at its query token's exit depth
            self.prompt = self.lazy_state(rows, chunk, h, e, allowed, rope, depth, full)
        final = h.clone()
        final[picks, query] = read
        final = coda_pass(model, final, Calls(self, "coda", 0, key, chunk, allowed, rope))
        return logits_of(model, final[picks, query]), depth

    def lazy_state(self, rows: Tensor, chunk: slice, h: Tensor, e: Tensor, allowed, rope, depth, full) -> LazyPrompt:
        """The lazy prompt of ``rows`` after their prefill of slots ``chunk`` (states h, e [R, m, d], its mask
        and RoPE tables): each row's prompt stands at its query token's exit ``depth`` [R], a ``full`` row's
        at its cap. A prefill from a cached prefix (chunk past slot 0, every row ``full``: never deepened) is
        padded to the prompt slots before it."""
        if full is not None:
            depth = torch.where(full, self.exits.caps[rows], depth)
        if chunk.start > 0:
            whole = slice(0, self.width)
            allowed = visible(self.slots, rows, whole, self.model.cfg.attention_window)
            h = torch.cat([h.new_zeros(h.shape[0], chunk.start, h.shape[-1]), h], dim=1)
            e = torch.cat([e.new_zeros(e.shape[0], chunk.start, e.shape[-1]), e], dim=1)
            if self.rope is not None:
                positions = self.slots.positions[rows, whole]
                rope = (self.rope[0][positions], self.rope[1][positions])
        return LazyPrompt(h, e, allowed, rope, depth.clone(), int(depth.min()))

    def lend(self, rows: Tensor, chunk: slice, t: int) -> None:
        """The tokens of ``rows`` stopped after loop t: their keys and values stand for the later loops up to their
        row's cap (a per-loop cache)."""
        if not self.mixed:
            if t < self.exit.loops:
                self.cache.lend(rows, chunk, t, self.exit.loops)
            return
        caps = self.exits.caps[rows]
        for cap in caps.unique().tolist():
            if cap > t:
                self.cache.lend(rows[caps == cap], chunk, t, cap)

    def core_call(self, h: Tensor | None, e: Tensor | None, calls, rows: Tensor | None, loop: Tensor | int):
        """:func:`~looplab.generation.passes.core_pass` of new tokens (states h, e [R, m, d] through ``calls``;
        None: no new token, only prompts) at ``loop`` ([R'] or one for all) of ``rows`` [R'] (None: no row's
        prompt is behind), after their lazy prompts that stand below it have run up to it: the last of those
        loops in the same layer calls as the new tokens where the view's passes run as chains of layers
        (``Capabilities.chains``; :func:`~looplab.generation.passes.fused_core_pass`: the weights read once for
        both). The new tokens' states after it. A token at loop t has run loop t − 1, so its prompt stands at
        most one loop below."""
        prompt = self.prompt
        if rows is None or prompt is None:
            return core_pass(self.model, h, e, calls)
        loop = torch.as_tensor(loop, device=rows.device).expand(len(rows))
        behind = prompt.depth[rows] < loop
        if not self.model.capabilities.chains or not bool(behind.any()):
            for t in loop[behind].unique().tolist():
                self.deepen_prompt(rows[behind & (loop == t)], t)
            return None if h is None else core_pass(self.model, h, e, calls)
        parts, deepened, chunk = [], [], slice(0, self.width)
        for t in loop[behind].unique().tolist():
            sub = rows[behind & (loop == t)]
            rope = None if prompt.rope is None else (prompt.rope[0][sub], prompt.rope[1][sub])
            parts.append((prompt.h[sub], prompt.e[sub], Calls(self, "core", t, sub, chunk, prompt.allowed[sub], rope)))
            deepened.append((sub, t))
        # the prompts first: the new tokens of a layer call read the keys and values their prompts write there
        states = fused_core_pass(self.model, parts if h is None else [*parts, (h, e, calls)])
        for (sub, t), state in zip(deepened, states):
            prompt.h[sub], prompt.depth[sub] = state, t
        prompt.shallowest = int(prompt.depth.min())
        return None if h is None else states[-1]

    def deepen_prompt(self, rows: Tensor, loop: int) -> None:
        """Run the prompt tokens of those ``rows`` whose prompt stands below ``loop`` up to it, writing
        their keys and values (a prompt token attends only to its row's prompt, so these are exact)."""
        prompt, model, chunk = self.prompt, self.model, slice(0, self.width)
        need = rows[prompt.depth[rows] < loop]
        if len(need):
            for t in range(int(prompt.depth[need].min()) + 1, loop + 1):
                sub = need[prompt.depth[need] < t]
                rope = None if prompt.rope is None else (prompt.rope[0][sub], prompt.rope[1][sub])
                calls = Calls(self, "core", t, sub, chunk, prompt.allowed[sub], rope)
                prompt.h[sub] = core_pass(model, prompt.h[sub], prompt.e[sub], calls)
                prompt.depth[sub] = t
        prompt.shallowest = int(prompt.depth.min())


@dataclass
class StepParams:
    read_only_exit: bool = param(
        False, None, "every token runs every loop to the cap and is read at its exit's loop (Ouro's own forward)"
    )


@register_decoder
class Step(DecodingMethod):
    """Every row's token of a step runs its loops (until its exit) before the next step: :class:`Decoder`."""

    name = "step"
    Params = StepParams

    def decode(self, model, prompts, max_new_tokens, options, finished, forced) -> Generation:
        return Decoder(model, prompts, max_new_tokens, options, finished, forced).run()
