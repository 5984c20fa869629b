"""A lazy prompt: under ``per_loop`` with an adaptive exit (and no coda) the cached decoder runs each prompt
only as deep as its tokens need (:class:`LazyPrompt`, its states kept to run later loops), and a depth-wise
decoder's prefill hands on the query tokens that run past loop 1 (:class:`RunningQueries`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.token_exits import Carried

__all__ = ["LazyPrompt", "RunningQueries"]


@dataclass
class LazyPrompt:
    """The prompts' states h, e [B, W, d], row b after ``depth[b]`` loops ([B] long; ``shallowest`` its
    minimum), with their attention mask [B, W, W] and RoPE tables."""

    h: Tensor
    e: Tensor
    allowed: Tensor
    rope: tuple[Tensor, Tensor] | None
    depth: Tensor
    shallowest: int

    @classmethod
    def free(cls, like: LazyPrompt, batch: int, loops: int) -> LazyPrompt:
        r"""A lazy prompt of ``batch`` rows shaped as ``like``'s, each free row standing at ``loops`` (never
        deepened) until a prompt :meth:`take`\ s its place."""

        def empty(t: Tensor) -> Tensor:
            return t.new_zeros((batch, *t.shape[1:]))

        rope = None if like.rope is None else (empty(like.rope[0]), empty(like.rope[1]))
        depth = torch.full((batch,), loops, dtype=like.depth.dtype, device=like.depth.device)
        return cls(empty(like.h), empty(like.e), empty(like.allowed), rope, depth, loops)

    def take(self, rows: Tensor, fresh: LazyPrompt) -> None:
        """Put ``fresh`` (the prompts of ``rows`` only, a later prefill's) in the place of those rows' prompts."""
        self.h[rows], self.e[rows], self.allowed[rows], self.depth[rows] = fresh.h, fresh.e, fresh.allowed, fresh.depth
        if self.rope is not None:
            self.rope[0][rows], self.rope[1][rows] = fresh.rope
        self.shallowest = int(self.depth.min())


@dataclass
class RunningQueries:
    """What a lazy prefill that stops after its first loop hands on (the decoder's ``HANDS_ON``: a depth-wise
    decoder's): which of its rows' query tokens had not exited (``running`` [R] bool), and for those their states
    h [R', d] after loop 1, their last loop's log-probabilities [R', V] (None where no exit reads them), and what
    their exits carry (``carried``, over the prefill's R rows)."""

    running: Tensor
    h: Tensor
    logp: Tensor | None
    carried: Carried
