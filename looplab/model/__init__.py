"""The looped transformer and its parts."""

from looplab.model.looped import LoopedTransformer

__all__ = ["LoopedTransformer"]
