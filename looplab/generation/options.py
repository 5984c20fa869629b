"""One generation's settings, checked together: :class:`DecodeOptions`.

Every way in (``looplab generate``, :func:`looplab.generation.generate`, a server request, lm-eval's
``looplab`` model) builds one, so a combination is refused by the same line everywhere:
:mod:`looplab.generation.fields` builds it from a CLI line, an HTTP body or lm-eval's ``model_args`` and
``gen_kwargs``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from looplab.errors import LooplabError
from looplab.generation.decoders import DecodingMethod, decoder_entry, decoder_params
from looplab.generation.policies import NO_CACHE, POLICIES, CachePolicy, cache_params
from looplab.generation.sampling import Sampling
from looplab.token_exits import GenerationExit

__all__ = ["DecodeOptions", "chosen"]


def chosen(cache: str | None, decoder: str) -> tuple[str, str]:
    """The cache and decoder a choice means: ``cache none`` with the step decoder is the ``recompute`` decoder
    (the step decoder's reference, spelled as a cache), and no cache named is the decoder's own (``none`` for
    one that keeps none, else ``per_loop``). One-line error for an unknown decoder."""
    if cache == NO_CACHE and decoder == "step":
        decoder = "recompute"
    if cache is None:
        cache = NO_CACHE if decoder_entry(decoder).caches == (NO_CACHE,) else "per_loop"
    return cache, decoder


@dataclass(frozen=True)
class DecodeOptions:
    """How a generation decodes.

    Attributes:
        exit_rule: the depth of each token (its exit, cap and the exit's parameters).
        cache: a KV cache policy (:data:`looplab.generation.policies.POLICIES`), or ``none`` (no cache: the
            ``recompute`` decoder); default ``per_loop`` (``none`` for ``recompute``).
        sampling: temperature, top-k and seed (default greedy).
        decoder: a registered decoder (:data:`looplab.generation.decoders.DECODERS`; default ``step``).
        cache_params, decoder_params: the policy's and the decoder's own parameters, a dict of their keys
            (the rest at their defaults) or their ``Params``; checked and stored as ``Params``.
    """

    exit_rule: GenerationExit = GenerationExit()
    cache: str | None = None
    sampling: Sampling = Sampling()
    decoder: str = "step"
    cache_params: Any = None
    decoder_params: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.exit_rule, GenerationExit):
            raise LooplabError(f"exit_rule must be a GenerationExit, got {type(self.exit_rule).__name__}")
        if not isinstance(self.sampling, Sampling):
            raise LooplabError(f"sampling must be a Sampling, got {type(self.sampling).__name__}")
        cache, decoder = chosen(self.cache, self.decoder)
        method = decoder_entry(decoder)
        if cache != NO_CACHE:
            params = cache_params(cache, self.cache_params)
        elif self.cache_params:
            raise LooplabError(f"no cache (cache {NO_CACHE}) takes no parameters, got {self.cache_params!r}")
        else:
            params = None
        object.__setattr__(self, "decoder", decoder)
        object.__setattr__(self, "cache", cache)
        object.__setattr__(self, "cache_params", params)
        object.__setattr__(self, "decoder_params", decoder_params(decoder, self.decoder_params))
        self._check_supported(method)

    def _check_supported(self, method: DecodingMethod) -> None:
        name, rule = method.name, self.exit_rule
        caches = method.caches if method.caches is not None else tuple(POLICIES)
        if self.cache not in caches:
            raise LooplabError(
                f"the {name} decoder decodes through the {' or '.join(caches)} cache, not {self.cache}: "
                f"valid caches for it: {', '.join(caches)}"
            )
        if rule.adaptive and not method.adaptive_exits:
            raise LooplabError(
                f"the {name} decoder reads every token at one depth: use the fixed exit, not {rule.name}"
            )
        if self.sampling.temperature != 0 and not method.sampling:
            raise LooplabError(f"the {name} decoder is greedy: use temperature 0, not {self.sampling.temperature:g}")

    def __hash__(self) -> int:  # Params dataclasses are mutable, so hash what they hold
        return hash((self.exit_rule, self.cache, self.sampling, self.decoder, repr(self.cache_params),
                     repr(self.decoder_params)))  # fmt: skip

    @property
    def method(self) -> DecodingMethod:
        return decoder_entry(self.decoder)

    @property
    def policy(self) -> CachePolicy | None:
        """The cache policy's entry (None without a cache)."""
        return POLICIES.get(self.cache)

    def but(self, **changes: Any) -> DecodeOptions:
        """A copy with ``changes`` (checked again); a changed decoder or cache drops the other's parameters
        unless given."""
        if "decoder" in changes and "decoder_params" not in changes:
            changes["decoder_params"] = None
        if "cache" in changes and "cache_params" not in changes:
            changes["cache_params"] = None
        return replace(self, **changes)
