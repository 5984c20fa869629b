"""The registry of transformers' native looped LMs: model_type → the adapter that wraps a loaded model
into the looped-model protocol (``looplab.model.protocol``).

    hrm_text             HrmTextForCausalLM                     one loop = one H cycle
    inkling2_loop_text   Inkling2LoopForCausalLM                one loop = one pass through the looped layers
    inkling2_loop        Inkling2LoopForConditionalGeneration   the same, on its text path

(:mod:`looplab.lm.hrm_text`, :mod:`looplab.lm.inkling2_loop`). An entry receives the loaded model
(and the adapter's keyword options) and returns the adapter, which shares the model's modules; its
``native_loops`` is the config's own loop count, at which the adapter's logits are the model's. A
new family is one adapter module (a :class:`looplab.lm.native.NativeLoop` subclass) and one line here.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from looplab.errors import LooplabError
from looplab.lm.hrm_text import HrmTextLoop
from looplab.lm.inkling2_loop import Inkling2Loop
from looplab.lm.native import NativeLoop

__all__ = ["LOOPED_FAMILIES", "native_loop"]

#: model_type → builder(model, **options) -> adapter
LOOPED_FAMILIES: dict[str, Callable[..., NativeLoop]] = {
    "hrm_text": HrmTextLoop.from_pretrained_model,
    "inkling2_loop_text": Inkling2Loop.from_pretrained_model,
    "inkling2_loop": Inkling2Loop.from_pretrained_model,
}


def native_loop(model: nn.Module, **options) -> NativeLoop:
    """The looped-model adapter of a loaded transformers native looped LM, chosen by its config's model_type."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in LOOPED_FAMILIES:
        raise LooplabError(
            f"no native looped adapter for model_type {model_type!r}; supported: {', '.join(sorted(LOOPED_FAMILIES))}"
        )
    return LOOPED_FAMILIES[model_type](model, **options)
