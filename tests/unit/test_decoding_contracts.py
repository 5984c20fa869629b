"""The contracts of the decoder and KV-cache-policy families (looplab/generation/decoders.py, policies.py), run
on every built-in entry and every example plugin's (tests/plugin_entries.py):

- a decoder that claims ``exact`` gives the step decoder's greedy tokens and depths (log-probabilities within
  1e-9) in float64 on every placement × injection, with mixed prompt lengths, at a fixed depth and, where it
  takes them, under an adaptive exit; one that scores teacher-forces the step decoder's log-probabilities;
  what it declares unsupported (caches, adaptive exits, sampling) is refused in one line, as is a model it
  cannot run;
- a cache policy holds ``held_loops`` loops of keys and values per core layer (what the memory check counts),
  reads what every other policy reads at one loop, and, when it claims ``exact``, what recomputing reads.
"""

from __future__ import annotations

import dataclasses
from typing import get_type_hints

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import DecodeOptions, GenerationExit, Sampling, generate, score
from looplab.generation.budget import generation_bytes
from looplab.generation.policies import NO_CACHE
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from tests.plugin_entries import REGISTRIES, installed, names
from tests.unit.test_speculative import NEW, PROMPTS, STRUCTURES, _causal

IDS = [f"{s['placement']}-{s['injection']}" for s in STRUCTURES]
KL = GenerationExit("kl", 6, {"eps": 0.05})


def _models():
    """(structure id, float64 causal model with a prelude and a coda) per placement × injection."""
    return [(name, _causal(**s, prelude_layers=1, coda_layers=1).double()) for name, s in zip(IDS, STRUCTURES)]


MODELS = _models()


def _caches(method) -> tuple[str, ...]:
    return method.caches if method.caches is not None else tuple(REGISTRIES["cache_policy"])


def _same(ours, theirs) -> None:
    assert ours.tokens == theirs.tokens and ours.depths == theirs.depths
    for mine, reference in zip(ours.logprobs, theirs.logprobs, strict=True):
        assert mine == pytest.approx(reference, abs=1e-9)


@pytest.mark.parametrize("name", names("decoder"))
def test_a_decoder_declares_typed_parameters_and_what_it_supports(name):
    with installed("decoder", name):
        method = REGISTRIES["decoder"][name]
        assert method.name == name and isinstance(method.exact, bool)
        for declared in dataclasses.fields(method.Params):
            assert declared.metadata.get("doc"), f"{name}.{declared.name} has no description"
            assert declared.name in get_type_hints(method.Params)
        assert set(_caches(method)) <= {*REGISTRIES["cache_policy"], NO_CACHE}
        DecodeOptions(GenerationExit("fixed", 4), _caches(method)[0], decoder=name)  # its defaults are valid


@pytest.mark.parametrize("name", names("decoder"))
def test_an_exact_decoder_gives_the_step_decoders_tokens_on_every_structure(name):
    with installed("decoder", name):
        method = REGISTRIES["decoder"][name]
        if not method.exact:
            pytest.skip(f"{name} claims no exactness")  # nothing to hold it to; the others' tests still run
        cache = _caches(method)[0]
        rules = [GenerationExit("fixed", 4), *([KL] if method.adaptive_exits else [])]
        for structure, model in MODELS:
            for rule in rules:
                options = DecodeOptions(rule, cache, decoder=name)
                try:
                    ours = generate(model, PROMPTS, NEW, options)
                except LooplabError as refused:  # a model it cannot run: refused in one line, before any work
                    assert "\n" not in str(refused), structure
                    continue
                reference_cache = "per_loop" if cache == NO_CACHE else cache
                _same(ours, generate(model, PROMPTS, NEW, DecodeOptions(rule, reference_cache)))
                if method.scoring:
                    text = [prompt + [3, 4, 5] for prompt in PROMPTS]
                    _same(score(model, text, options), score(model, text, DecodeOptions(rule, reference_cache)))


@pytest.mark.parametrize("name", names("decoder"))
def test_what_a_decoder_does_not_support_is_refused_in_one_line(name):
    with installed("decoder", name):
        method = REGISTRIES["decoder"][name]
        refused = []
        unsupported = [c for c in (*REGISTRIES["cache_policy"], NO_CACHE) if c not in _caches(method)]
        if name != "recompute":  # `none` with the step decoder means recompute, so try the others only
            refused += [dict(cache=cache) for cache in unsupported if cache != NO_CACHE]
        if not method.adaptive_exits:
            refused.append(dict(exit_rule=KL))
        if not method.sampling:
            refused.append(dict(sampling=Sampling(temperature=0.7)))
        for change in refused:
            settings = dict(exit_rule=GenerationExit("fixed", 4), cache=_caches(method)[0], decoder=name) | change
            with pytest.raises(LooplabError) as error:
                DecodeOptions(**settings)
            assert f"the {name} decoder" in str(error.value) and "\n" not in str(error.value)
        if not method.scoring:
            with pytest.raises(LooplabError, match="picks its own tokens"):
                score(
                    MODELS[0][1],
                    [[3, 4, 5]],
                    DecodeOptions(GenerationExit("fixed", 4), _caches(method)[0], decoder=name),
                )


@pytest.mark.parametrize("name", names("cache_policy"))
def test_a_cache_policy_holds_the_loops_it_declares(name):
    with installed("cache_policy", name):
        policy = REGISTRIES["cache_policy"][name]
        model = decodable(_causal(core_layers=2, prelude_layers=0, coda_layers=0).double())
        loops = 5
        options = DecodeOptions(GenerationExit("fixed", loops), name)
        decoder = Decoder(model, PROMPTS, NEW, options)
        decoder.run()
        batch, slots = decoder.slots.positions.shape
        head_dim = model.cfg.d_model // model.cfg.n_heads
        per_loop = 2 * batch * model.cfg.n_heads * slots * head_dim * torch.float64.itemsize
        held = policy.held_loops(options.cache_params, loops)
        assert 1 <= held <= loops
        assert decoder.cache.nbytes() == held * per_loop * len(model.core)
        needed = generation_bytes(model, batch, decoder.width, NEW, loops, name, options.cache_params)
        assert needed >= decoder.cache.nbytes()  # the memory check counts at least what it holds


@pytest.mark.parametrize("name", names("cache_policy"))
def test_a_cache_policy_reads_what_every_policy_reads_at_one_loop_and_recomputing_when_exact(name):
    with installed("cache_policy", name):
        policy = REGISTRIES["cache_policy"][name]
        for structure, model in MODELS:
            one = GenerationExit("fixed", 1)
            _same(
                generate(model, PROMPTS, NEW, DecodeOptions(one, name)),
                generate(model, PROMPTS, NEW, DecodeOptions(one)),
            )
            if policy.exact:
                for rule in (GenerationExit("fixed", 4), GenerationExit("fixed", 6)):
                    ours = generate(model, PROMPTS, NEW, DecodeOptions(rule, name))
                    _same(ours, generate(model, PROMPTS, NEW, DecodeOptions(rule, NO_CACHE)))
            deep = generate(model, PROMPTS, NEW, DecodeOptions(KL, name))  # an adaptive exit runs under it
            assert all(1 <= d <= KL.loops for row in deep.depths for d in row), structure
