"""Every decoding view declares its capabilities (``looplab.model.decoding``), and each declaration holds to the
methods its class has: the decoder reads the flags, so a flag without its method, or a method without its flag,
would run the wrong pass silently."""

from __future__ import annotations

import pytest

from looplab.generation.retrofit import RetrofitDecoding
from looplab.lm.families import FAMILIES
from looplab.lm.ouro import GatedOuroDecoding
from looplab.model import LoopedTransformer
from looplab.model.decoding import PASSES, Capabilities

#: each pass → the method a view that runs it defines
METHODS = {"prelude": "prelude_pass", "core": "core_pass", "coda": "coda_pass", "logits": "logits"}
VIEWS = [LoopedTransformer, RetrofitDecoding, *(family.view for family in FAMILIES), GatedOuroDecoding]


@pytest.mark.parametrize("view", VIEWS, ids=lambda view: view.__name__)
def test_a_views_capabilities_match_its_methods(view):
    capabilities = view.capabilities
    assert isinstance(capabilities, Capabilities)
    for name, method in METHODS.items():
        assert (name in capabilities.passes) == hasattr(view, method), (view.__name__, name)
    assert capabilities.rope == hasattr(view, "rope_tables"), view.__name__
    assert capabilities.gate == hasattr(view, "with_gate"), view.__name__


def test_only_the_gated_twin_carries_the_gate_and_it_is_the_one_with_gate_returns():
    assert [view.__name__ for view in VIEWS if view.capabilities.gated] == ["GatedOuroDecoding"]
    gated = [family.view for family in FAMILIES if family.view.capabilities.gate]
    assert [view.with_gate.__annotations__["return"] for view in gated] == ["GatedOuroDecoding"]


def test_an_unknown_pass_is_refused():
    with pytest.raises(ValueError, match="unknown passes \\['loop'\\]; valid choices: " + ", ".join(PASSES)):
        Capabilities(passes=frozenset({"loop"}))
