"""Every random choice flows from the run seed through named, derived generators.

Deriving a fresh generator per (seed, purpose, index) instead of carrying one
generator through the run means that step s of training draws the same batch
whether or not the run was interrupted before s, so resume needs no RNG state.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed determined by ``seed`` and the purpose ``parts``."""
    digest = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def derive_generator(seed: int, *parts: object) -> torch.Generator:
    """A CPU generator seeded by :func:`derive_seed`."""
    return torch.Generator().manual_seed(derive_seed(seed, *parts))
