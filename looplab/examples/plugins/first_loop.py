"""A KV cache policy plugin: every earlier token is read at its first loop. Each core layer keeps one slot
per token (``shared``'s memory, flat in depth), written at loop 1 only; a token's own keys and values at
later loops are seen by itself and by the tokens beside it in the same pass, never kept.
(``--cache first_loop``; a cheaper and coarser flat cache than ``shared``, which keeps each token's last.)"""

import torch

from looplab.generation.policies import CachePolicy, register_cache_policy
from looplab.generation.stores import LayerCache


class FirstLoopStore(LayerCache):
    """Keys and values [B, H, S, Dh] of each slot's loop 1; the tokens being run keep theirs for the pass."""

    def write(self, rows, chunk, k, v, loop):
        self.running = (k, v)  # [R, H, m, Dh]: what the tokens of this pass attend to among themselves
        if loop <= 1:
            self.k[rows, :, chunk] = k
            self.v[rows, :, chunk] = v

    def read(self, rows, chunk, loop):
        k, v = self.running
        keys = torch.cat([self.k[rows, :, : chunk.start], k], dim=2)
        return keys, torch.cat([self.v[rows, :, : chunk.start], v], dim=2)


@register_cache_policy
class FirstLoop(CachePolicy):
    name = "first_loop"

    def core_store(self, params, shape, dtype, device) -> FirstLoopStore:
        return FirstLoopStore.zeros(shape, dtype, device)

    def held_loops(self, params, loops: int) -> int:
        return 1
