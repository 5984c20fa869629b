"""Generation for looped language models: KV caches across loops and a depth per token (docs/methods.md §9).

Three plugin families meet here: generation exits (:mod:`looplab.generation.exits`), KV cache policies
(:mod:`looplab.generation.policies`) and decoders (:mod:`looplab.generation.decoders`); a
:class:`DecodeOptions` chooses one of each with its parameters, and :func:`generate` runs it."""

from looplab.generation.cache import KVCache
from looplab.generation.decode import Generation, Sampling, generate, score
from looplab.generation.decoders import DECODERS, DecodingMethod, register_decoder
from looplab.generation.exits import EXITS, MAX_LOOPS, GenerationExit, token_exit_params
from looplab.generation.options import DecodeOptions
from looplab.generation.policies import POLICIES, CachePolicy, register_cache_policy

__all__ = [
    "DECODERS",
    "EXITS",
    "MAX_LOOPS",
    "POLICIES",
    "CachePolicy",
    "DecodeOptions",
    "DecodingMethod",
    "GenerationExit",
    "Generation",
    "KVCache",
    "Sampling",
    "generate",
    "register_cache_policy",
    "register_decoder",
    "score",
    "token_exit_params",
]
