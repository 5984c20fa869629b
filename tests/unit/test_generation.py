"""Generation: cached decoding equals recomputation, batches equal single prompts, exits match a reference loop."""

from __future__ import annotations

import itertools

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import ExitRule, Sampling, generate
from looplab.generation.text import cut_at_stop, decode, encode, unescape
from tests.unit.model_helpers import make_model

PROMPTS = [[3, 5, 6, 2, 1], [3, 4], [3, 4, 4, 6, 1, 5, 2, 2]]
ONE_TOKEN_PROMPTS = [[3], [3]]

STRUCTURES = [
    dict(placement=placement, injection=injection)
    for placement, injection in itertools.product(
        ("pre", "post", "pre_sandwich", "post_sandwich"), ("add", "concat", "none")
    )
]


def causal_model(**overrides):
    base = dict(causal=True, core_layers=2, max_len=64)
    return make_model(**{**base, **overrides})


def reference_logits(model, sequence: list[int], loops: int) -> torch.Tensor:
    """Next-token logits [V] after ``sequence``, recomputing it whole (no cache)."""
    tokens = torch.tensor([sequence])
    return model(tokens, torch.ones_like(tokens, dtype=torch.bool), loops)[0, -1]


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: f"{s['placement']}-{s['injection']}")
def test_per_loop_cache_equals_recomputation_token_for_token(structure):
    model = causal_model(**structure, prelude_layers=1, coda_layers=1)
    cached = generate(model, PROMPTS, 6, ExitRule("fixed", 3), "per_loop")
    uncached = generate(model, PROMPTS, 6, ExitRule("fixed", 3), "none")
    assert cached.tokens == uncached.tokens
    for prompt, new in zip(PROMPTS, cached.tokens):
        assert len(new) == 6
        for i, token in enumerate(new):  # every step's greedy choice is the recomputed argmax
            assert int(reference_logits(model, prompt + new[:i], 3).argmax()) == token


@pytest.mark.parametrize("positional", ["rope", "learned", "nope"])
@pytest.mark.parametrize("window", [0, 2])
def test_cached_logits_match_recomputation_in_float64(positional, window):
    model = causal_model(positional=positional, attention_window=window, init_state="zeros", injection="add")
    # a sampled path visits tokens greedy decoding would not; compare each step's logits exactly
    result = generate(model, PROMPTS[:2], 5, ExitRule("fixed", 4), "per_loop", Sampling(temperature=1.5, seed=3))
    replay = generate(model, PROMPTS[:2], 5, ExitRule("fixed", 4), "none", Sampling(temperature=1.5, seed=3))
    assert result.tokens == replay.tokens
    from looplab.generation.decode import _Decoder

    decoder = _Decoder(model, [PROMPTS[0]], 1, ExitRule("fixed", 4), "per_loop", Sampling(), None)
    rows = torch.arange(1)
    logits, _ = decoder.forward(decoder.tokens, rows, slice(0, decoder.width), decoder.lengths - 1, prefill=True)
    assert torch.allclose(logits[0], reference_logits(model, PROMPTS[0], 4), atol=1e-10)


@pytest.mark.parametrize("cache", ["per_loop", "shared"])
@pytest.mark.parametrize("exit_name", ["fixed", "convergence", "confidence"])
def test_a_batch_of_mixed_lengths_equals_each_prompt_alone(cache, exit_name):
    model = causal_model(placement="post_sandwich", norm="rmsnorm")
    rule = ExitRule(exit_name, 8, eps=0.05, threshold=0.2)
    together = generate(model, PROMPTS, 5, rule, cache)
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], 5, rule, cache)
        assert alone.tokens[0] == together.tokens[row]
        assert alone.depths[0] == together.depths[row]


def test_exit_depths_equal_a_reference_loop():
    """Convergence exit with the per-loop cache: each token's depth is the first loop at which its
    relative step falls below eps, computed here by recomputing the whole sequence loop by loop."""
    model = causal_model(placement="pre", injection="add")
    rule = ExitRule("convergence", 30, eps=0.1)
    result = generate(model, [PROMPTS[0]], 6, rule, "per_loop")
    depths = result.depths[0]
    assert max(depths) < 30 and len(set(depths)) > 1, depths
    # the first token's depth depends on the prompt alone, which every loop computes exactly
    tokens = torch.tensor([PROMPTS[0]])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    states = [h[0, -1] for h, _ in model.unroll(tokens, valid, 30)]
    expected = next(
        t for t in range(2, 31) if (states[t - 1] - states[t - 2]).norm() < rule.eps * states[t - 1].norm() or t == 30
    )
    assert depths[0] == expected


@pytest.mark.parametrize("cache", ["per_loop", "shared"])
def test_the_prefill_runs_to_the_cap_whatever_the_exit(cache):
    """The prompt's keys and values at every loop up to the cap are what a fixed-cap prefill writes,
    even when the exit stops every prompt's last token at loop 1."""
    from looplab.generation.decode import _Decoder

    model = causal_model()
    caches = []
    for rule in (ExitRule("fixed", 6), ExitRule("confidence", 6, threshold=1e-9)):
        decoder = _Decoder(model, PROMPTS, 1, rule, cache, Sampling(), None)
        _, depths = decoder.forward(
            decoder.tokens, torch.arange(len(PROMPTS)), slice(0, decoder.width), decoder.lengths - 1, prefill=True
        )
        caches.append(decoder.cache.layers)
    assert depths.tolist() == [1, 1, 1]
    assert caches[0].keys() == caches[1].keys()
    for key, layer in caches[0].items():
        assert torch.equal(layer.k, caches[1][key].k) and torch.equal(layer.v, caches[1][key].v), key


def test_one_token_prompts_are_prefilled_to_the_cap():
    model = causal_model()
    cached = generate(model, ONE_TOKEN_PROMPTS, 4, ExitRule("fixed", 3), "per_loop")
    assert cached.tokens == generate(model, ONE_TOKEN_PROMPTS, 4, ExitRule("fixed", 3), "none").tokens
    adaptive = generate(model, ONE_TOKEN_PROMPTS, 4, ExitRule("confidence", 5, threshold=1e-9), "per_loop")
    assert [row[0] for row in adaptive.depths] == [1, 1]


def test_adaptive_exit_with_a_cap_of_one_is_the_fixed_depth():
    model = causal_model()
    fixed = generate(model, PROMPTS, 4, ExitRule("fixed", 1), "per_loop")
    for name in ("convergence", "kl", "confidence"):
        adaptive = generate(model, PROMPTS, 4, ExitRule(name, 1), "per_loop")
        assert adaptive.tokens == fixed.tokens and {d for row in adaptive.depths for d in row} == {1}


def test_shared_cache_at_one_loop_equals_per_loop():
    """With one loop there is one loop's keys and values: the policies coincide."""
    model = causal_model(placement="pre_sandwich")
    a = generate(model, PROMPTS, 5, ExitRule("fixed", 1), "per_loop")
    b = generate(model, PROMPTS, 5, ExitRule("fixed", 1), "shared")
    assert a.tokens == b.tokens


def test_shared_cache_memory_does_not_grow_with_depth():
    model = causal_model()
    per_loop = [generate(model, PROMPTS, 3, ExitRule("fixed", k), "per_loop").cache_bytes for k in (2, 8)]
    shared = [generate(model, PROMPTS, 3, ExitRule("fixed", k), "shared").cache_bytes for k in (2, 8)]
    assert per_loop[1] == 4 * per_loop[0]
    assert shared[0] == shared[1] < per_loop[0]


def test_sampling_is_reproducible_from_its_seed_and_top_k_one_is_greedy():
    model = causal_model()
    draws = [
        generate(model, PROMPTS, 8, ExitRule("fixed", 2), "per_loop", Sampling(1.0, 0, seed)) for seed in (0, 0, 1)
    ]
    assert draws[0].tokens == draws[1].tokens
    assert draws[0].tokens != draws[2].tokens
    greedy = generate(model, PROMPTS, 8, ExitRule("fixed", 2), "per_loop")
    top1 = generate(model, PROMPTS, 8, ExitRule("fixed", 2), "per_loop", Sampling(5.0, 1, 7))
    assert top1.tokens == greedy.tokens


def test_a_finished_row_stops_and_the_others_go_on():
    model = causal_model()
    free = generate(model, PROMPTS, 6, ExitRule("fixed", 2), "per_loop")
    stop_after_two = generate(model, PROMPTS, 6, ExitRule("fixed", 2), "per_loop", finished=lambda ids: len(ids) >= 2)
    assert [len(row) for row in stop_after_two.tokens] == [2, 2, 2]
    assert [row[:2] for row in free.tokens] == stop_after_two.tokens


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: generate(m, PROMPTS, 3, ExitRule("fixed", 2), "per_layer"), "valid choices: per_loop, shared, none"),
        (lambda m: generate(m, PROMPTS, 3, ExitRule("kl", 4), "none"), "use the fixed exit"),
        (lambda m: generate(m, [[]], 3), "at least one token"),
        (lambda m: generate(m, PROMPTS, 0), "max new tokens must be >= 1"),
        (lambda m: ExitRule("halting"), "valid choices: confidence, convergence, fixed, kl"),
        (lambda m: ExitRule("fixed", 0), "must be >= 1"),
        (lambda m: ExitRule("confidence", threshold=1.5), "threshold must be in (0, 1]"),
        (lambda m: Sampling(temperature=-1), "temperature must be >= 0"),
    ],
)
def test_bad_generation_settings_name_the_problem(call, message):
    with pytest.raises(LooplabError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        call(causal_model())


def test_a_bidirectional_model_is_refused():
    with pytest.raises(LooplabError, match="needs a causal model"):
        generate(make_model(causal=False), PROMPTS, 2)


def test_text_round_trip_and_stop_strings():
    assert decode(encode("k=7;q=k+1;q?")) == "k=7;q=k+1;q?"
    assert encode("ÿ") == [3, 4 + 0xC3, 4 + 0xBF]  # <s>, then the UTF-8 bytes, byte b as token 4 + b
    assert cut_at_stop("8\nand more", ["\n"]) == "8\n"
    assert cut_at_stop("no stop here", ["\n", ";"]) is None
    assert cut_at_stop("a;b\nc", ["\n", ";"]) == "a;"


def test_stop_strings_typed_with_escapes():
    assert unescape("\\n") == "\n" and unescape("a\\tb") == "a\tb" and unescape("x\\\\n") == "x\\n"
    assert unescape("ü;") == "ü;"
