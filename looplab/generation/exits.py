"""Per-token exits for generation: after each loop, whether a token's next-token distribution is final.

Each rule sees, for the rows still running, the new token's state after loop t
and the one before (h_t, h_{t−1}: [R, d]) and the next-token log-probabilities
(log p_t, log p_{t−1}: [R, V]; only computed when the rule reads them), and
returns [R] bool: stop here. Loop ``cap`` always stops.

    fixed        t = loops
    convergence  ‖h_t − h_{t−1}‖ / ‖h_t‖ < eps                      (t ≥ 2)
    kl           KL(p_t ‖ p_{t−1}) < eps: the distribution settled   (t ≥ 2)
    confidence   max p_t ≥ threshold
    halting      the run's own halting head says halt on the token's state (its logit > 0,
                 at the loops where its schedule decides: every segment's end for act_bce
                 and q_halt, every loop for rl_halting and pondernet)

A rule is a registered :class:`TokenExit`: add one with ``@register_token_exit(name,
reads_logits=..., first_loop=...)`` on a function ``(rule, t, h, h_prev, logp, logp_prev) -> [R] bool``
(``rule`` is the :class:`ExitRule`, for its ``eps``, ``threshold`` and ``halts``), in a plugin module.
An entry also says whether a token may stop before the cap (``adaptive``; only ``fixed`` never
does) and whether it reads the run's halting head (``needs_head``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from looplab.errors import LooplabError, choice_error
from looplab.plugins import register_entry


@dataclass(frozen=True)
class TokenExit:
    """A registered per-token exit: whether it reads the logits, the first loop it may stop at, its test,
    whether a token may stop before the cap and whether the test reads the run's halting head."""

    name: str
    reads_logits: bool
    first_loop: int
    stops: Callable[..., Tensor]
    adaptive: bool = True
    needs_head: bool = False

    @property
    def origin(self) -> str:
        return f"{self.stops.__module__}.{self.stops.__qualname__}"


EXITS: dict[str, TokenExit] = {}


def register_token_exit(
    name: str, reads_logits: bool, first_loop: int = 1, adaptive: bool = True, needs_head: bool = False
):
    """Function decorator: make ``stops`` available as the generation exit ``name``."""

    def register(stops):
        entry = TokenExit(name, reads_logits, first_loop, stops, adaptive, needs_head)
        register_entry(EXITS, name, entry, "generation exit")
        return stops

    return register


@register_token_exit("fixed", reads_logits=False, adaptive=False)
def _fixed(rule, t, h, h_prev, logp, logp_prev):
    return torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)  # only the cap stops it


@register_token_exit("convergence", reads_logits=False, first_loop=2)
def _convergence(rule, t, h, h_prev, logp, logp_prev):
    return (h - h_prev).norm(dim=-1) < rule.eps * h.norm(dim=-1)


@register_token_exit("kl", reads_logits=True, first_loop=2)
def _kl(rule, t, h, h_prev, logp, logp_prev):
    return (logp.exp() * (logp - logp_prev)).sum(-1) < rule.eps


@register_token_exit("confidence", reads_logits=True)
def _confidence(rule, t, h, h_prev, logp, logp_prev):
    return logp.max(dim=-1).values.exp() >= rule.threshold


@register_token_exit("halting", reads_logits=False, needs_head=True)
def _halting(rule, t, h, h_prev, logp, logp_prev):
    if rule.halts is None:
        raise LooplabError("the halting exit needs the run's halting head (a run trained with a halting schedule)")
    return rule.halts(h, t)


@dataclass(frozen=True)
class ExitRule:
    """A per-token exit: its ``name`` (a key of :data:`EXITS`), the loop cap and its threshold.

    ``halts`` (the ``halting`` exit's): ``(h [R, d], t) -> [R] bool``, the run's halting head's
    decision on each token's state after loop t (:func:`looplab.generation.text.head_halts`).
    """

    name: str = "fixed"
    loops: int = 4  # the fixed depth, or the cap of an adaptive exit
    eps: float = 1e-3
    threshold: float = 0.9
    halts: Callable[[Tensor, int], Tensor] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.name not in EXITS:
            raise choice_error("exit", self.name, EXITS)
        if self.loops < 1:
            raise LooplabError(f"the exit's loops (depth or cap) must be >= 1, got {self.loops}")
        if not self.eps > 0:
            raise LooplabError(f"the exit's eps must be > 0, got {self.eps}")
        if not 0 < self.threshold <= 1:
            raise LooplabError(f"the confidence threshold must be in (0, 1], got {self.threshold}")

    @property
    def reads_logits(self) -> bool:
        return EXITS[self.name].reads_logits

    @property
    def adaptive(self) -> bool:
        """Whether a token may stop before the cap (every exit but ``fixed``)."""
        return EXITS[self.name].adaptive

    @property
    def needs_head(self) -> bool:
        """Whether the exit reads the run's halting head (``halts``)."""
        return EXITS[self.name].needs_head

    def stop(self, t: int, h: Tensor, h_prev: Tensor, logp: Tensor | None, logp_prev: Tensor | None) -> Tensor:
        """[R] bool: the rows whose token stops after loop t."""
        rows = h.shape[0]
        if t >= self.loops:
            return torch.ones(rows, dtype=torch.bool, device=h.device)
        entry = EXITS[self.name]
        if t < entry.first_loop:
            return torch.zeros(rows, dtype=torch.bool, device=h.device)
        return entry.stops(self, t, h, h_prev, logp, logp_prev)
