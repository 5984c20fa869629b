"""What one layer call keeps of earlier tokens during generation: its keys and values per slot, in one
store (:class:`LayerCache`) or in a ring of the last m loops (:class:`RingLayerCache`), and a temporal
convolution's inputs per slot (:class:`SlotStore`). A cache policy (:mod:`looplab.generation.policies`)
says which store a core layer call gets; :class:`looplab.generation.cache.KVCache` holds them.

The contract of a store of keys and values: ``write(rows, chunk, k, v, loop)`` stores the new tokens'
k, v [R, H, m, Dh] in slots ``chunk`` of ``rows`` at core loop ``loop``; ``read(rows, chunk, loop)``
returns the keys and values [R, H, chunk.stop, Dh] those tokens attend to (their own just written);
``k`` and ``v`` hold what the slots keep now; ``nbytes()`` the bytes held.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LayerCache", "RingLayerCache", "SlotStore"]


@dataclass
class LayerCache:
    """Keys and values of one layer call: k, v [B, H, S, Dh]; what was written is tracked by the owner."""

    k: Tensor
    v: Tensor

    @classmethod
    def zeros(cls, shape: tuple[int, int, int, int], dtype: torch.dtype, device) -> LayerCache:
        """An empty store of keys and values, each of ``shape`` (B, H, S, Dh)."""
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def write(self, rows: Tensor | slice, chunk: slice, k: Tensor, v: Tensor, loop: int) -> None:
        """Store the new tokens' k, v [R, H, m, Dh] in slots ``chunk`` of ``rows``."""
        self.k[rows, :, chunk] = k
        self.v[rows, :, chunk] = v

    def read(self, rows: Tensor | slice, chunk: slice, loop: int) -> tuple[Tensor, Tensor]:
        """Keys and values [R, H, chunk.stop, Dh] of slots 0..chunk.stop − 1 that ``rows`` attend to at ``loop``
        (the new tokens in ``chunk`` have just been written)."""
        return self.k[rows, :, : chunk.stop], self.v[rows, :, : chunk.stop]

    def entries(self, rows: Tensor | slice, chunk: slice) -> tuple[Tensor, Tensor]:
        """The keys and values [R, H, m, Dh] slots ``chunk`` of ``rows`` hold now."""
        return self.k[rows, :, chunk], self.v[rows, :, chunk]

    def copy_slots(self, source: LayerCache, rows: Tensor, chunk: slice) -> None:
        """Take ``source``'s entries of slots ``chunk`` of ``rows`` (a ``per_loop`` lend)."""
        self.k[rows, :, chunk] = source.k[rows, :, chunk]
        self.v[rows, :, chunk] = source.v[rows, :, chunk]

    def empty_like(self) -> LayerCache:
        return LayerCache.zeros(self.k.shape, self.k.dtype, self.k.device)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class SlotStore:
    """What one layer call's temporal convolution read of each slot: ``values`` [B, S, C] (its input
    there, after its padding mask); a later token's convolution reads its row's previous ones."""

    values: Tensor

    def copy_slots(self, source: SlotStore, rows: Tensor, chunk: slice) -> None:
        self.values[rows, chunk] = source.values[rows, chunk]

    def empty_like(self) -> SlotStore:
        return SlotStore(torch.zeros_like(self.values))

    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()


@dataclass
class RingLayerCache:
    """A core layer's keys and values under ``last_m``: k, v [m, B, H, S, Dh], loop t in ring t mod m,
    and ``last`` [B, S] long, the last loop written to each slot (0: none)."""

    k: Tensor
    v: Tensor
    last: Tensor

    def write(self, rows: Tensor | slice, chunk: slice, k: Tensor, v: Tensor, loop: int) -> None:
        ring = loop % self.k.shape[0]
        self.k[ring, rows, :, chunk] = k
        self.v[ring, rows, :, chunk] = v
        self.last[rows, chunk] = loop

    def read(self, rows: Tensor | slice, chunk: slice, loop: int) -> tuple[Tensor, Tensor]:
        keep, start, stop = self.k.shape[0], chunk.start, chunk.stop
        own = loop % keep  # the new tokens were just written at this loop
        last = self.last[rows, :start]  # [R, start]
        ring = torch.minimum(torch.clamp(last - keep + 1, min=loop), last) % keep
        earlier = ring[last > 0]  # slots never written are never attended
        if earlier.numel() == 0 or bool((earlier == earlier[0]).all()):
            # every earlier token is read from one ring (as at a fixed depth): slices, no gather
            common = int(earlier[0]) if earlier.numel() else own
            if common == own:
                return self.k[own, rows, :, :stop], self.v[own, rows, :, :stop]
            k = torch.cat([self.k[common, rows, :, :start], self.k[own, rows, :, start:stop]], dim=2)
            v = torch.cat([self.v[common, rows, :, :start], self.v[own, rows, :, start:stop]], dim=2)
            return k, v
        ring = torch.cat([ring, torch.full_like(self.last[rows, start:stop], own)], dim=1)
        index = torch.arange(self.k.shape[1], device=ring.device)[rows][:, None]
        slots = torch.arange(stop, device=ring.device)[None, :]
        # advanced indices split by the head slice land first: [R, S', H, Dh] → [R, H, S', Dh]
        return self.k[ring, index, :, slots].transpose(1, 2), self.v[ring, index, :, slots].transpose(1, 2)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
