"""Per-token exits for generation: after each loop, whether a token's next-token distribution is final.

Each rule sees, for the rows still running, the new token's state after loop t
and the one before (h_t, h_{t−1}: [R, d]) and the next-token log-probabilities
(log p_t, log p_{t−1}: [R, V]; only computed when the rule reads them), and
returns [R] bool: stop here. Loop ``cap`` always stops.

    fixed        t = loops
    convergence  ‖h_t − h_{t−1}‖ / ‖h_t‖ < eps                      (t ≥ 2)
    kl           KL(p_t ‖ p_{t−1}) < eps: the distribution settled   (t ≥ 2)
    confidence   max p_t ≥ threshold
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError

EXITS = ("fixed", "convergence", "kl", "confidence")


@dataclass(frozen=True)
class ExitRule:
    """A per-token exit: its ``name`` (one of :data:`EXITS`), the loop cap and its threshold."""

    name: str = "fixed"
    loops: int = 4  # the fixed depth, or the cap of an adaptive exit
    eps: float = 1e-3
    threshold: float = 0.9

    def __post_init__(self) -> None:
        if self.name not in EXITS:
            raise LooplabError(f"unknown exit {self.name!r}; valid choices: {', '.join(EXITS)}")
        if self.loops < 1:
            raise LooplabError(f"the exit's loops (depth or cap) must be >= 1, got {self.loops}")
        if not self.eps > 0:
            raise LooplabError(f"the exit's eps must be > 0, got {self.eps}")
        if not 0 < self.threshold <= 1:
            raise LooplabError(f"the confidence threshold must be in (0, 1], got {self.threshold}")

    @property
    def reads_logits(self) -> bool:
        return self.name in ("kl", "confidence")

    def stop(self, t: int, h: Tensor, h_prev: Tensor, logp: Tensor | None, logp_prev: Tensor | None) -> Tensor:
        """[R] bool: the rows whose token stops after loop t."""
        rows = h.shape[0]
        if t >= self.loops:
            return torch.ones(rows, dtype=torch.bool, device=h.device)
        if self.name == "fixed" or (t < 2 and self.name != "confidence"):
            return torch.zeros(rows, dtype=torch.bool, device=h.device)
        if self.name == "convergence":
            return (h - h_prev).norm(dim=-1) < self.eps * h.norm(dim=-1)
        if self.name == "kl":
            return (logp.exp() * (logp - logp_prev)).sum(-1) < self.eps
        return logp.max(dim=-1).values.exp() >= self.threshold
