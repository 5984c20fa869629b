"""Residual norm placements (docs/methods.md §1) and their registry.

For a sublayer f and norms N₁ (before f) and N₂ (after):

    pre            x + f(N₁(x))
    post           N₂(x + f(x))
    pre_sandwich   x + N₂(f(N₁(x)))      (Ouro's "sandwich output")
    post_sandwich  N₂(x + f(N₁(x)))      (Huginn's "sandwich residual"; the STARS default)

A placement is written once, as a function of x, f, N₁ and N₂ that uses
nothing but those maps and ``+``. The forward pass calls it on tensors; the
loop's linearisation (``looplab.model.tangent``) calls the same function on
:class:`Dual` values (a value and its tangent map), so every placement has its
exact J v without a rule of its own. To add one, decorate such a function with
``@register_placement(name, norm_in=..., norm_out=...)`` (which norms it uses)
in a module of its own, and name the module in ``[run] plugins``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from looplab.errors import choice_error
from looplab.plugins import register_entry

__all__ = ["Placement", "PLACEMENTS", "Dual", "register_placement", "placement"]

#: x, f, N₁, N₂ ↦ the wrapped sublayer's output (N₁ / N₂ are None when the placement does not use them)
Apply = Callable[[Any, Callable, Callable | None, Callable | None], Any]


@dataclass(frozen=True)
class Placement:
    """A registered placement: its name, which norms it uses, and the one function that applies it."""

    name: str
    norm_in: bool
    norm_out: bool
    apply: Apply

    @property
    def origin(self) -> str:
        """Where its function is defined (how the registry tells a re-import from a name clash)."""
        return f"{self.apply.__module__}.{self.apply.__qualname__}"


PLACEMENTS: dict[str, Placement] = {}


def register_placement(name: str, norm_in: bool, norm_out: bool) -> Callable[[Apply], Apply]:
    """Function decorator: make ``apply`` available as ``model.placement = name``."""

    def register(apply: Apply) -> Apply:
        register_entry(PLACEMENTS, name, Placement(name, norm_in, norm_out, apply), "placement")
        return apply

    return register


def placement(name: str) -> Placement:
    """The registered placement ``name``; a one-line error naming the valid ones."""
    if name not in PLACEMENTS:
        raise choice_error("value for model.placement:", name, PLACEMENTS)
    return PLACEMENTS[name]


class Dual:
    """A value and its tangent map at that value (dx ↦ dy), composed by :meth:`lift` and ``+``."""

    def __init__(self, value: Tensor, tangent: Callable[[Tensor], Tensor]):
        self.value, self.tangent = value, tangent

    @staticmethod
    def identity(x: Tensor) -> Dual:
        return Dual(x, lambda dx: dx)

    @staticmethod
    def lift(linearise: Callable[[Tensor], tuple[Tensor, Callable[[Tensor], Tensor]]]) -> Callable[[Dual], Dual]:
        """A map on duals from ``linearise`` (x ↦ (g(x), its tangent map at x)), by the chain rule."""

        def apply(x: Dual) -> Dual:
            y, tangent = linearise(x.value)
            return Dual(y, lambda dx: tangent(x.tangent(dx)))

        return apply

    def __add__(self, other: Dual) -> Dual:
        return Dual(self.value + other.value, lambda dx: self.tangent(dx) + other.tangent(dx))


@register_placement("pre", norm_in=True, norm_out=False)
def pre(x, f, norm_in, norm_out):
    return x + f(norm_in(x))


@register_placement("post", norm_in=False, norm_out=True)
def post(x, f, norm_in, norm_out):
    return norm_out(x + f(x))


@register_placement("pre_sandwich", norm_in=True, norm_out=True)
def pre_sandwich(x, f, norm_in, norm_out):
    return x + norm_out(f(norm_in(x)))


@register_placement("post_sandwich", norm_in=True, norm_out=True)
def post_sandwich(x, f, norm_in, norm_out):
    return norm_out(x + f(norm_in(x)))
