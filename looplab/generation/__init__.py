"""Generation for looped language models: KV caches across loops and a depth per token (docs/methods.md §9)."""

from looplab.generation.cache import POLICIES, KVCache
from looplab.generation.decode import BATCHING, Generation, Sampling, generate, score
from looplab.generation.exits import EXITS, MAX_LOOPS, GenerationExit, token_exit_params

__all__ = [
    "BATCHING",
    "EXITS",
    "MAX_LOOPS",
    "POLICIES",
    "GenerationExit",
    "Generation",
    "KVCache",
    "Sampling",
    "generate",
    "score",
    "token_exit_params",
]
