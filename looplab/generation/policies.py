"""KV cache policies: the family that says which earlier keys and values a new token reads at each loop
(docs/methods.md §9), and its built-in entries.

    per_loop   one store per (loop, core layer): a token at loop t reads every earlier token's loop-t keys
               and values, exactly what recomputing the whole sequence computes. A token that exited at
               depth k < t lends its loop-k entries to loops t > k. Memory grows with depth.
    shared     one store per core layer across loops: each token's slot holds the keys and values of the
               last loop it ran, so an earlier token is read at its exit depth at every loop (Huginn's
               cache). Memory does not grow with depth.
    last_m     each token keeps the keys and values of its last m = ``keep_loops`` loops (a ring of m per
               core layer): a token at loop t reads an earlier token that exited at depth e at loop
               clamp(t, e − m + 1, e). m = 1 is ``shared``; m ≥ the cap is ``per_loop``.

The contract of an entry (a subclass of :class:`CachePolicy`, registered with
:func:`register_cache_policy`): ``core_store(params, shape, dtype, device)`` makes the store of one core
layer call (:mod:`looplab.generation.stores`: ``write``, ``read``, ``k``, ``v``, ``nbytes``) for a batch of
``shape`` = (B, H, S, Dh); ``held_loops(params, loops)`` is how many loops of keys and values a token holds
per core layer at a cap of ``loops`` (what the memory check counts); ``per_loop`` says that every loop has
a store of its own (the decoder then keys the stores by loop and lends an exited token's entries upward);
``exact`` that the policy reads what recomputing reads; ``at_cap(params, loops)`` (optional) the
parameters a generation capped at ``loops`` sizes its stores by (``last_m``: a ring of at most the cap).
Its own parameters are a ``Params`` dataclass of :func:`looplab.params.param` fields, set by
``--cache-param KEY=VALUE``, a request's fields, or lm-eval's ``model_args``. Prelude and coda layers run
once per token: they have one plain store each under every policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from looplab.errors import choice_error
from looplab.exits import NoParams
from looplab.generation.stores import LayerCache, RingLayerCache
from looplab.params import Domain, entry_params, param
from looplab.plugins import check_complete, register_entry
from looplab.token_exits import MAX_LOOPS

__all__ = ["POLICIES", "CachePolicy", "register_cache_policy", "cache_params", "NO_CACHE"]

#: the cache choice that keeps nothing: every step recomputes each row whole (the ``recompute`` decoder)
NO_CACHE = "none"


class CachePolicy(ABC):
    """A registered KV cache policy (module docstring)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    per_loop: ClassVar[bool] = False
    exact: ClassVar[bool] = False

    @abstractmethod
    def core_store(self, params: Any, shape: tuple[int, int, int, int], dtype: torch.dtype, device) -> Any:
        """The store of one core layer call's keys and values for ``shape`` = (B, H, S, Dh)."""

    @abstractmethod
    def held_loops(self, params: Any, loops: int) -> int:
        """Loops of keys and values a token holds per core layer at a cap of ``loops``."""

    def index_bytes(self, params: Any) -> int:
        """Bytes per slot and core layer the policy keeps beside keys and values (a ring's loop index)."""
        return 0

    def at_cap(self, params: Any, loops: int) -> Any:
        """``params`` for a generation whose tokens run at most ``loops`` loops (what its stores are sized by;
        by default the same)."""
        return params

    @property
    def origin(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}"


POLICIES: dict[str, CachePolicy] = {}


def register_cache_policy(cls: type[CachePolicy]) -> type[CachePolicy]:
    """Class decorator: make the policy ``cls`` (its ``name`` and ``Params`` set) available by its name."""
    check_complete(cls, cls.name, "KV cache policy")
    register_entry(POLICIES, cls.name, cls(), "KV cache policy")
    return cls


def cache_params(name: str, values: Any = None) -> Any:
    """The checked ``Params`` of policy ``name`` from a dict of its keys (the rest at their defaults), or an
    instance checked as is; one-line errors naming the valid keys and domains."""
    if name not in POLICIES:
        raise choice_error("KV cache policy", name, (*POLICIES, NO_CACHE))
    return entry_params(POLICIES[name].Params, values, f"cache.{name}", f"the {name} cache")


@register_cache_policy
class PerLoop(CachePolicy):
    name = "per_loop"
    per_loop = True
    exact = True

    def core_store(self, params, shape, dtype, device) -> LayerCache:
        return LayerCache.zeros(shape, dtype, device)

    def held_loops(self, params, loops: int) -> int:
        return loops


@register_cache_policy
class Shared(CachePolicy):
    name = "shared"

    def core_store(self, params, shape, dtype, device) -> LayerCache:
        return LayerCache.zeros(shape, dtype, device)

    def held_loops(self, params, loops: int) -> int:
        return 1


@dataclass
class LastMParams:
    keep_loops: int = param(2, Domain(1, MAX_LOOPS), "the loops of keys and values each token keeps (m)")


@register_cache_policy
class LastM(CachePolicy):
    name = "last_m"
    Params = LastMParams

    def core_store(self, params, shape, dtype, device) -> RingLayerCache:
        zeros = torch.zeros((params.keep_loops, *shape), dtype=dtype, device=device)
        last = torch.zeros(shape[0], shape[2], dtype=torch.long, device=device)
        return RingLayerCache(zeros, zeros.clone(), last)

    def held_loops(self, params, loops: int) -> int:
        return min(params.keep_loops, loops)

    def at_cap(self, params, loops: int) -> LastMParams:
        # a ring longer than the cap holds loops no token reaches; one of the cap's length reads the same slots
        return replace(params, keep_loops=min(params.keep_loops, loops))

    def index_bytes(self, params) -> int:
        return 8  # the ring's last loop per slot (long)
