"""The decoding view of each kind of model :func:`looplab.generation.generate` takes: a looplab model
as it is, a retrofit (:mod:`looplab.generation.retrofit`), a native looped LM from transformers
(:mod:`looplab.generation.native`). A new looped family is one more view and one more line here."""

from __future__ import annotations

from torch import nn

from looplab.generation.native import HrmTextDecoding, Inkling2LoopDecoding
from looplab.generation.retrofit import RetrofitDecoding
from looplab.lm.hrm_text import HrmTextLoop
from looplab.lm.inkling2_loop import Inkling2Loop
from looplab.lm.retrofit import RetrofittedLoop

__all__ = ["VIEWS", "decodable"]

#: adapter class → the decoding view that wraps it
VIEWS = {RetrofittedLoop: RetrofitDecoding, HrmTextLoop: HrmTextDecoding, Inkling2Loop: Inkling2LoopDecoding}


def decodable(model: nn.Module) -> nn.Module:
    """``model`` as the decoder reads it: an adapter in its view, anything else (a looplab model) as is."""
    for adapter, view in VIEWS.items():
        if isinstance(model, adapter):
            return view(model)
    return model
