"""The registry of looped-LM families a model dir may hold, one record each (:class:`looplab.lm.native.ModelFamily`):

    family        model_type                                    one loop
    HRM-Text      hrm_text                                      one H cycle (L_cycles L passes, then H)
    Inkling-2     inkling2_loop_text, inkling2_loop             one pass through the looped layers
    Ouro          ouro                                          the L layers and the norm closing them
    Huginn-0125   huginn_raven                                  the concat adapter and the 4 core blocks
    Nanbeige4.2   nanbeige                                      the L Llama layers and the norm closing them
    Parcae        (none: _class_name ParcaeConfig)              the diagonal injection and the core blocks

HRM-Text and Inkling-2 are built by transformers; Ouro, Huginn, Nanbeige and Parcae, whose only published
code is hub remote code or a research repository, are built by looplab from their config.json and weights
(no remote code runs).
A family is one module ending in its record (the adapter, its decoding view, how it is built and how
many loops it runs by itself) and one entry in :data:`FAMILIES`.
"""

from __future__ import annotations

from torch import nn

from looplab.errors import LooplabError
from looplab.lm import hrm_text, huginn, inkling2_loop, nanbeige, ouro, parcae
from looplab.lm.native import ModelFamily, NativeLoop

__all__ = ["CONFIG_CLASS_NAMES", "FAMILIES", "LOOPED_FAMILIES", "family_of", "native_loop"]

FAMILIES: tuple[ModelFamily, ...] = (
    hrm_text.FAMILY,
    inkling2_loop.FAMILY,
    ouro.FAMILY,
    huginn.FAMILY,
    nanbeige.FAMILY,
    parcae.FAMILY,
)
#: model_type → its family
LOOPED_FAMILIES: dict[str, ModelFamily] = {kind: family for family in FAMILIES for kind in family.model_types}
#: config.json's ``_class_name`` → the model_type standing for its family (a config.json without a model_type)
CONFIG_CLASS_NAMES: dict[str, str] = {
    name: next(iter(family.model_types)) for family in FAMILIES for name in family.config_class_names
}


def family_of(adapter: nn.Module) -> ModelFamily | None:
    """The family whose adapter ``adapter`` is (None for a looplab model or a retrofit)."""
    return next((family for family in FAMILIES if isinstance(adapter, family.adapter)), None)


def native_loop(model: nn.Module, **options) -> NativeLoop:
    """The looped-model adapter of a loaded native looped LM, chosen by its config's model_type."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in LOOPED_FAMILIES:
        raise LooplabError(
            f"no native looped adapter for model_type {model_type!r}; supported: {', '.join(sorted(LOOPED_FAMILIES))}"
        )
    return LOOPED_FAMILIES[model_type].adapter.from_pretrained_model(model, **options)
