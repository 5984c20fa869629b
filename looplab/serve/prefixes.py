"""Prefix caching: the keys and values of prompt blocks, kept for later requests whose prompts begin alike.

A prompt is cut into blocks of :data:`BLOCK` tokens; block b is known by every token up to its end (so two
prompts share block b only when they agree on all of its tokens and every earlier one's). After a row's
prompt is prefilled, the keys and values of its whole blocks — of every layer call, the core's at every loop
up to the row's cap — are kept (:class:`PrefixStore`); a later prompt of the same cohort and cap that begins
with kept blocks copies them into its row and prefills only the rest (at least its last token, whose logits
it reads).

Exact where the cache policy makes it so: under ``per_loop`` a prompt token's keys and values at loop t
depend only on the tokens before it, up to loop t, whichever exit the request reads its own tokens at. Only
a prompt that ran to its row's cap keeps its blocks: one at a fixed exit, or one after a kept prefix (an
adaptive exit's prompt otherwise runs lazily, only as deep as its tokens need, its later loops run only when
a later token needs them: it reads kept blocks but keeps none). A block is keyed by the cap (a coda's keys
and values follow the states at the cap) and the cohort (cache, decoder and view). Copied keys and values
were computed in another batch, so a row's later results match its own prefill to float rounding (~1e-6),
as continuous batching's do. Other policies (``shared``, ``last_m``: their one store holds the latest loop's keys) and
families whose layer calls keep convolution inputs are not cached.

The store is the runner's and holds its blocks in the engine's KV memory: the scheduler's ledger
(:class:`~looplab.serve.ledger.KVLedger`) counts their bytes, which the runner reports each step, and gives
the store its ``room`` each step (what the groups leave free, at most ``limit``; 0 when a new group needs
it all). The least recently used blocks go first; the store counts the prompt tokens it was asked for and
those it served (the hit rate).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

__all__ = ["BLOCK", "PrefixStore", "Hit"]

#: tokens per block
BLOCK = 16


@dataclass
class Hit:
    """A prompt's kept prefix: ``tokens`` of it (a multiple of BLOCK), its keys and values ``state``."""

    tokens: int
    state: dict


class PrefixStore:
    """Kept blocks within ``limit`` bytes and the ``room`` the scheduler gives it, least recently used first
    out."""

    def __init__(self, limit: int, block: int = BLOCK):
        self.limit, self.block = limit, block
        self.room = limit
        self.blocks: OrderedDict[tuple, tuple[dict, int]] = OrderedDict()
        self.nbytes = 0
        self.asked = self.served = 0  # prompt tokens that could have been served, and were

    def whole_blocks(self, prompt: list[int]) -> int:
        """Blocks of ``prompt`` a hit may cover: whole ones, leaving its last token to run."""
        return (len(prompt) - 1) // self.block

    def has_first(self, cohort, job, head: tuple) -> bool:
        """Whether the first block ``head`` of ``job``'s prompt is kept (not counted as a lookup)."""
        return (cohort, job.options.exit_rule.loops, head) in self.blocks

    def find(self, cohort, cap: int, prompt: list[int]) -> Hit | None:
        """The longest kept prefix of ``prompt`` (blocks from the first on) for ``cohort`` at loop cap ``cap``."""
        wanted = self.whole_blocks(prompt)
        if wanted == 0:
            return None
        self.asked += wanted * self.block
        found = []
        for b in range(1, wanted + 1):
            key = (cohort, cap, tuple(prompt[: b * self.block]))
            if key not in self.blocks:
                break
            self.blocks.move_to_end(key)
            found.append(self.blocks[key][0])
        if not found:
            return None
        self.served += len(found) * self.block
        state = {name: tuple(_cat([block[name][i] for block in found]) for i in (0, 1)) for name in found[0]}
        return Hit(len(found) * self.block, state)

    def keep(self, cohort, cap: int, prompt: list[int], decoder, row: int) -> None:
        """Keep the whole blocks of ``prompt``, just prefilled in ``row`` of ``decoder`` to cap ``cap``, that are
        not kept yet, while they fit the store's limit and its room."""
        for b in range(1, self.whole_blocks(prompt) + 1):
            key = (cohort, cap, tuple(prompt[: b * self.block]))
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            state = decoder.cache.slot_state(row, (b - 1) * self.block, b * self.block, cap)
            nbytes = sum(t.numel() * t.element_size() for pair in state.values() for t in pair)
            while self.blocks and self.nbytes + nbytes > min(self.limit, self.room):
                self.drop_oldest()
            if self.nbytes + nbytes > min(self.limit, self.room):
                return
            self.blocks[key] = (state, nbytes)
            self.nbytes += nbytes

    def drop_oldest(self) -> None:
        """Give back the least recently used block's bytes."""
        _, (_, nbytes) = self.blocks.popitem(last=False)
        self.nbytes -= nbytes

    def make_room(self, room: int) -> None:
        """Hold at most ``room`` bytes from now on, the least recently used blocks given back first."""
        self.room = room
        while self.blocks and self.nbytes > min(self.limit, room):
            self.drop_oldest()


def _cat(parts: list) -> torch.Tensor:
    """Tensors [..., s, Dh] of consecutive slots, joined along the slots."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
