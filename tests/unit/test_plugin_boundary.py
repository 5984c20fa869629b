"""What a plugin's decoder, exit or cache policy returns is checked where looplab receives it, and its own
exception is reported naming the entry: table-driven, each case one line naming the entry, never a wrapped
AttributeError, a NaN served, or a wrong answer printed with exit 0."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import DecodeOptions, GenerationExit, generate
from looplab.generation.decoders import DECODERS, DecodingMethod, register_decoder
from looplab.generation.policies import POLICIES, CachePolicy, register_cache_policy
from looplab.generation.sampling import Generation
from looplab.generation.stores import LayerCache
from looplab.token_exits import EXITS, register_token_exit
from tests.unit.test_speculative import STRUCTURES, _causal

PROMPTS = [[1, 2, 3], [4, 5]]
NEW = 3


@pytest.fixture(scope="module")
def model():
    return _causal(**STRUCTURES[0])


def _honest(model) -> Generation:
    return generate(model, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 2)))


#: what a misbehaving decoder returns, given the honest answer → the words its refusal holds
DECODER_ANSWERS = {
    "none": (lambda g: None, "returned NoneType, not a Generation"),
    "a dict": (lambda g: {"tokens": g.tokens}, "returned dict, not a Generation"),
    "a row fewer": (lambda g: replace(g, tokens=g.tokens[:1]), "returned 1 rows of tokens for 2 prompts"),
    "token 10**6": (lambda g: replace(g, tokens=[[10**6, *r[1:]] for r in g.tokens]), "token 1000000 in row 0"),
    "token -5": (lambda g: replace(g, tokens=[[-5, *r[1:]] for r in g.tokens]), "token -5 in row 0"),
    "three times the tokens": (
        lambda g: Generation([r * 3 for r in g.tokens], [r * 3 for r in g.depths], [r * 3 for r in g.logprobs]),
        "9 tokens for prompt 0, asked for at most 3",
    ),
    "depths shorter": (lambda g: replace(g, depths=[r[:1] for r in g.depths]), "3 tokens, 1 depths"),
    "depth 0": (lambda g: replace(g, depths=[[0, *r[1:]] for r in g.depths]), "depth 0 in row 0, outside 1..2"),
    "NaN log-probability": (
        lambda g: replace(g, logprobs=[[float("nan"), *r[1:]] for r in g.logprobs]),
        "log-probability nan in row 0",
    ),
    "a positive log-probability": (
        lambda g: replace(g, logprobs=[[0.5, *r[1:]] for r in g.logprobs]),
        "log-probability 0.5 in row 0",
    ),
    "a first token other than greedy's while it claims exact": (  # (both rows' greedy first token is 3)
        lambda g: replace(g, tokens=[[(r[0] + 1) % 7, *r[1:]] for r in g.tokens]),
        "claims exact (greedy tokens equal the step decoder's) but gave row 0 the first token 4, 1.59 nats below",
    ),
}


@pytest.mark.parametrize("case", DECODER_ANSWERS, ids=list(DECODER_ANSWERS))
def test_a_plugin_decoders_answer_is_checked(model, case):
    honest = _honest(model)
    answer, words = DECODER_ANSWERS[case]

    @register_decoder
    class Liar(DecodingMethod):
        name = "liar"

        def decode(self, model, prompts, max_new_tokens, options, finished, forced):
            return answer(honest)

    try:
        with pytest.raises(LooplabError) as caught:
            generate(model, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 2), decoder="liar"))
        message = str(caught.value)
        assert "decoder 'liar' (" in message and "Liar" in message and words in message, message
        assert "\n" not in message
    finally:
        del DECODERS["liar"]


def test_a_plugin_decoder_that_claims_exact_and_is_passes_the_spot_check(model):
    """The spot check holds an honest plugin (the example that decodes each prompt alone) to nothing it fails."""
    from looplab.examples.plugins.one_at_a_time import OneAtATime

    register_decoder(OneAtATime)
    try:
        options = DecodeOptions(GenerationExit("fixed", 2), decoder=OneAtATime.name)
        assert generate(model, PROMPTS, NEW, options).tokens == _honest(model).tokens
    finally:
        del DECODERS[OneAtATime.name]


def test_a_plugin_decoders_own_exception_names_it(model):
    @register_decoder
    class Broken(DecodingMethod):
        name = "broken"

        def decode(self, model, prompts, max_new_tokens, options, finished, forced):
            return None.tokens

    try:
        with pytest.raises(LooplabError, match=r"decoder 'broken' \(.*Broken\) failed: AttributeError: 'NoneType'"):
            generate(model, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 2), decoder="broken"))
    finally:
        del DECODERS["broken"]


#: what a misbehaving exit returns for R rows → the words its refusal holds
EXIT_ANSWERS = {
    "none": (lambda h: None, "returned None"),
    "a dict": (lambda h: {"stop": True}, "returned {'stop': True}"),
    "floats": (lambda h: torch.zeros(h.shape[0]), "returned a torch.float32 tensor of shape [2]"),
    "a 0-d tensor": (lambda h: torch.tensor(True), "returned a torch.bool tensor of shape []"),
    "a row fewer": (lambda h: torch.zeros(h.shape[0] - 1, dtype=torch.bool), "tensor of shape [1]"),
    "raises": (lambda h: 1 / 0, "failed: ZeroDivisionError: division by zero"),
}


@pytest.mark.parametrize("case", EXIT_ANSWERS, ids=list(EXIT_ANSWERS))
def test_a_plugin_exits_answer_is_checked(model, case):
    answer, words = EXIT_ANSWERS[case]
    register_token_exit("odd-exit", reads_logits=False)(lambda rule, t, h, h_prev, logp, logp_prev: answer(h))
    try:
        with pytest.raises(LooplabError) as caught:
            generate(model, PROMPTS, NEW, DecodeOptions(GenerationExit("odd-exit", 3)))
        message = str(caught.value)
        assert "generation exit 'odd-exit' (" in message and words in message, message
    finally:
        del EXITS["odd-exit"]


@pytest.mark.parametrize("held", [0, -1000, 2.5, None])
def test_a_plugin_cache_policys_held_loops_is_checked(model, held):
    @register_cache_policy
    class Odd(CachePolicy):
        name = "odd"

        def core_store(self, params, shape, dtype, device):
            return LayerCache.zeros(shape, dtype, device)

        def held_loops(self, params, loops):
            return held

    try:
        with pytest.raises(LooplabError, match=rf"KV cache policy 'odd' \(.*Odd\) says a token holds {held!r} loops"):
            generate(model, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 2), "odd"))
    finally:
        del POLICIES["odd"]


@pytest.mark.parametrize("name", ["", "   ", 5, None])
def test_an_entry_needs_a_name(name):
    class Nameless(DecodingMethod):
        def decode(self, model, prompts, max_new_tokens, options, finished, forced):
            return Generation()

    Nameless.name = name
    with pytest.raises(ValueError, match="registered under a name, a non-empty string"):
        register_decoder(Nameless)
    assert name not in DECODERS
