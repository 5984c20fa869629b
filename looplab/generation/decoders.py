"""Decoders: the family of ways to run a generation's tokens through a looped model, and its registry.

    step        every row's token of a step runs its loops before the next step (the reference cached decoder)
    recompute   no cache: every step recomputes each row whole (the reference the cached decoders are tested
                against; ``--cache none``)
    depth       each core call advances every running row by one loop of its own token; waiting prompts take
                finished rows (``max_batch``)
    wavefront   many positions of a row in flight, each at its own loop, each a guess checked by greedy
                decoding (``front``)
    speculative the model at fewer loops drafts ``draft_tokens`` tokens, one pass at the full depth verifies

The contract of an entry (a subclass of :class:`DecodingMethod`, registered with :func:`register_decoder`):
``decode(model, prompts, max_new_tokens, options, finished, forced)`` returns the
:class:`~looplab.generation.sampling.Generation` of a batch (``model`` is a decoding view,
:func:`looplab.generation.views.decodable`; ``options`` a checked
:class:`~looplab.generation.options.DecodeOptions`); ``check(model, prompts, max_new_tokens, options,
sources)`` refuses, in one line and before anything is allocated, what the model or the batch cannot take
(the default checks the memory budget of every prompt at once). It declares what it supports:
``adaptive_exits`` (exits that stop a token before the cap), ``caches`` (the cache policies it decodes
through; None: every registered one), ``sampling`` (False: greedy only), ``scoring`` (teacher-forced
tokens), and its claim, ``exact``: greedy tokens equal the step decoder's in float64 (its contract test
holds it to that on every model structure). Its own parameters are a ``Params`` dataclass of
:func:`looplab.params.param` fields, set by ``--decoder-param KEY=VALUE``, a request's fields, or lm-eval's
``model_args``. A combination an entry does not support is refused by :class:`DecodeOptions` in one line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from looplab.errors import choice_error
from looplab.exits import NoParams
from looplab.params import entry_params
from looplab.plugins import check_complete, register_entry

__all__ = ["DECODERS", "DecodingMethod", "register_decoder", "decoder_params"]


class DecodingMethod(ABC):
    """A registered decoder (module docstring)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    adaptive_exits: ClassVar[bool] = True
    caches: ClassVar[tuple[str, ...] | None] = None
    sampling: ClassVar[bool] = True
    scoring: ClassVar[bool] = True
    exact: ClassVar[bool] = True

    def check(self, model, prompts: list[list[int]], max_new_tokens: int, options, sources) -> None:
        """Refuse what ``model`` (a decoding view) or this batch cannot take; by default, a batch whose every
        prompt at once does not fit in memory or in the model's positions."""
        from looplab.generation.budget import check_budget

        lengths = [len(prompt) for prompt in prompts]
        rule = options.exit_rule
        check_budget(model, lengths, max_new_tokens, rule.loops, options.cache, options.cache_params, sources)

    @abstractmethod
    def decode(self, model, prompts: list[list[int]], max_new_tokens: int, options, finished, forced):
        """The :class:`~looplab.generation.sampling.Generation` of ``prompts`` (module docstring)."""

    @property
    def origin(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}"


DECODERS: dict[str, DecodingMethod] = {}


def register_decoder(cls: type[DecodingMethod]) -> type[DecodingMethod]:
    """Class decorator: make the decoder ``cls`` (its ``name``, ``Params`` and what it supports set) available
    by its name."""
    check_complete(cls, cls.name, "decoder")
    register_entry(DECODERS, cls.name, cls(), "decoder")
    return cls


def decoder_entry(name: str) -> DecodingMethod:
    """The registered decoder ``name``, or a one-line error naming the valid choices."""
    if not isinstance(name, str) or name not in DECODERS:
        raise choice_error("decoder", name, DECODERS)
    return DECODERS[name]


def decoder_params(name: str, values: Any = None) -> Any:
    """The checked ``Params`` of decoder ``name`` from a dict of its keys (the rest at their defaults), or an
    instance checked as is; one-line errors naming the valid keys and domains."""
    return entry_params(decoder_entry(name).Params, values, f"decoder.{name}", f"the {name} decoder")
