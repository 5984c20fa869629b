"""The decoding view of each kind of model :func:`looplab.generation.generate` takes: a looplab model
as it is, a retrofit (:mod:`looplab.generation.retrofit`), a native looped LM through its family's view
(the family record's ``view``, :data:`looplab.lm.families.FAMILIES`)."""

from __future__ import annotations

from torch import nn

from looplab.generation.retrofit import RetrofitDecoding
from looplab.lm.families import FAMILIES, family_of
from looplab.lm.retrofit import RetrofittedLoop

__all__ = ["decodable", "described"]

#: every native family's decoding view class
FAMILY_VIEWS: tuple[type, ...] = tuple(family.view for family in FAMILIES)


def decodable(model: nn.Module, gated: bool = False) -> nn.Module:
    """``model`` as the decoder reads it (a :class:`~looplab.model.decoding.DecodingView`): an adapter in its
    view, anything else (a looplab model, a view) as is.

    ``gated``: the view carries the exit gate's decision in its state (the ``gate`` exit; a family whose view
    declares the ``gate`` capability, with ``with_gate``)."""
    if gated and isinstance(model, FAMILY_VIEWS) and not model.capabilities.gated:  # view its adapter, gated
        model = model.loop
    if isinstance(model, RetrofittedLoop):
        return RetrofitDecoding(model)
    family = family_of(model)
    if family is None:
        return model
    return family.view.with_gate(model) if gated and family.view.capabilities.gate else family.view(model)


def described(view: nn.Module) -> str:
    """How a refusal names the model behind a decoding view: its family (``Ouro``, ``Huginn-0125``; with the
    gate exit where the view carries it), a retrofit, or a looplab model."""
    loop = view.loop if isinstance(view, (*FAMILY_VIEWS, RetrofitDecoding)) else view
    family = family_of(loop)
    if family is not None:
        return family.name + (" with the gate exit" if view.capabilities.gated else "")
    return "a retrofit" if isinstance(loop, RetrofittedLoop) else "this looplab model"
