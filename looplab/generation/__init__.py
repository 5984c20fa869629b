"""Generation for looped language models: KV caches across loops and a depth per token (docs/methods.md §9)."""

from looplab.generation.cache import POLICIES, KVCache
from looplab.generation.decode import Generation, Sampling, generate, score
from looplab.generation.exits import EXITS, ExitRule

__all__ = ["EXITS", "POLICIES", "ExitRule", "Generation", "KVCache", "Sampling", "generate", "score"]
