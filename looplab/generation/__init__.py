"""Generation for looped language models: KV caches across loops and a depth per token (docs/methods.md §9).

Three plugin families meet here: generation exits (:mod:`looplab.token_exits`), KV cache policies
(:mod:`looplab.generation.policies`) and decoders (:mod:`looplab.generation.decoders`); a
:class:`DecodeOptions` chooses one of each with its parameters, and :func:`generate` runs it.

Where things are: ``entry`` (:func:`generate`, :func:`score`: checks, then the chosen decoder), ``decoders``
(the decoder family and its registry), ``step`` (the step decoder, whose prefill, passes and cache the others
build on), ``depthwise``, ``wavefront``, ``speculative``, ``recompute`` (the other decoders), ``passes`` (a
prelude, core and coda pass over the cache), ``row_exits`` (each row of a batch stopping by its own exit),
``cache``, ``stores``, ``paged``, ``block_tables`` and ``policies`` (keys and values: the cache, its stores,
the paged pool, a paged cache's block tables, the cache policies), ``options``, ``fields`` (a request's flat
decode fields), ``checks``, ``budget``, ``sampling``, ``views`` (a model as the decoders read it), and text in
and out (``text``, ``text_lm``, ``byte_text``, ``reasoning``, ``retrofit``)."""

from looplab.generation.cache import KVCache
from looplab.generation.decoders import DECODERS, DecodingMethod, register_decoder
from looplab.generation.entry import Generation, Sampling, generate, score
from looplab.generation.options import DecodeOptions
from looplab.generation.policies import POLICIES, CachePolicy, register_cache_policy
from looplab.token_exits import EXITS, MAX_LOOPS, GenerationExit, token_exit_params

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
