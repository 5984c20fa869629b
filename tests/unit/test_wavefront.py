"""Wavefront decoding (looplab/generation/wavefront.py): many positions of a row in flight at once give the step
decoder's greedy tokens, depths and log-probabilities (float64) on every placement and injection, every
position scheme and a window, fixed and adaptive exits, every front, rows that finish early; the guesses that
hold save sequential calls; what it does not take is refused in one line."""

from __future__ import annotations

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import GenerationExit, Sampling, generate
from looplab.generation.options import DecodeOptions
from looplab.generation.wavefront import WavefrontDecoder
from tests.unit.model_helpers import make_model
from tests.unit.test_speculative import NEW, PROMPTS, STRUCTURES  # mixed prompt lengths; 16 placements × injections

EXITS = [
    GenerationExit("fixed", 5),
    GenerationExit("convergence", 8, {"eps": 0.2}),
    GenerationExit("convergence", 8, {"eps": 0.05}),
    GenerationExit("kl", 8, {"eps": 0.01}),
    GenerationExit("argmax-stability", 8, {"steps": 2}),  # a count each position in flight carries
]


def _causal(**overrides):
    return make_model(**{**dict(causal=True, core_layers=2, max_len=96), **overrides})


def _assert_same(model, prompts, rule, front, finished=None):
    step = generate(model, prompts, NEW, DecodeOptions(rule, "per_loop"), finished)
    wave = generate(
        model,
        prompts,
        NEW,
        DecodeOptions(rule, "per_loop", decoder="wavefront", decoder_params={"front": front}),
        finished,
    )
    assert wave.tokens == step.tokens
    assert wave.depths == step.depths
    for ours, theirs in zip(wave.logprobs, step.logprobs, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-9)
    return step


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: f"{s['placement']}-{s['injection']}")
def test_wavefront_decoding_is_greedy_decoding_on_every_structure(structure):
    model = _causal(**structure, prelude_layers=1)
    depths = set()
    for rule in EXITS:
        for front in (2, 8):
            depths |= {d for row in _assert_same(model, PROMPTS, rule, front).depths for d in row}
    assert depths >= {5}


@pytest.mark.parametrize("positional, window", [("rope", 0), ("learned", 0), ("nope", 0), ("rope", 3)])
def test_every_position_scheme_and_a_window(positional, window):
    model = _causal(positional=positional, attention_window=window, injection="contractive")
    for rule in (GenerationExit("fixed", 4), GenerationExit("convergence", 8, {"eps": 0.2})):
        _assert_same(model, PROMPTS, rule, 4)


def test_rows_that_finish_early_leave_and_the_others_go_on():
    model = _causal(placement="post_sandwich", injection="add")
    rule = GenerationExit("convergence", 8, {"eps": 0.05})
    whole = _assert_same(model, PROMPTS, rule, 6)
    stop_token = whole.tokens[1][2]
    early = _assert_same(model, PROMPTS, rule, 6, finished=lambda ids: ids[-1] == stop_token)
    assert early.tokens[1][-1] == stop_token and len(early.tokens[1]) <= 3
    assert max(map(len, early.tokens)) == NEW


@pytest.mark.parametrize("injection", ["add", "contractive"])
def test_guesses_that_hold_save_sequential_calls(injection):
    """A front of one position is the sequential decode: its calls are the depths of the positions it runs;
    a wider front runs the same loops in fewer calls, down to about one per token where guesses hold."""
    model = _causal(placement="post", injection=injection).eval()
    rule = GenerationExit("fixed", 5)
    calls = {}
    for front in (1, 2, 5):
        decoder = WavefrontDecoder(model, PROMPTS[:1], NEW, DecodeOptions(rule), None, front)
        with torch.no_grad():
            decoder.run()
        calls[front] = decoder.calls
    assert calls[1] == (NEW - 1) * 5  # the first token comes from the prefill
    assert calls[5] <= calls[2] < calls[1]


@pytest.mark.parametrize(
    "model_kind, kwargs, message",
    [
        ("looplab", dict(cache="shared"), "the wavefront decoder decodes through the per_loop cache, not shared"),
        ("looplab", dict(decoder_params={"front": -1}), "decoder.wavefront.front must be in [0, inf), got -1"),
        ("looplab", dict(decoder_params={"front": True}), "decoder.wavefront.front must be int, got True"),
        ("looplab", dict(sampling=Sampling(temperature=1.0)), "the wavefront decoder is greedy"),
        ("coda", {}, "a coda (1 layers) would read their unfinished states: valid models have no coda"),
        ("looplab", dict(decoder="step", decoder_params={"front": 4}), "unknown parameter of the step decoder 'front'"),
        ("looplab", dict(forced=[[1], [2], [3], [4]]), "the wavefront decoder picks its own tokens"),
    ],
)
def test_what_wavefront_decoding_does_not_take_is_one_line(model_kind, kwargs, message):
    model = _causal(coda_layers=1) if model_kind == "coda" else _causal()
    kwargs = dict(kwargs)
    forced = kwargs.pop("forced", None)
    with pytest.raises(LooplabError) as err:
        options = DecodeOptions(GenerationExit("fixed", 4), **({"decoder": "wavefront"} | kwargs))
        generate(model, PROMPTS, 4, options, forced=forced)
    assert message in str(err.value) and "\n" not in str(err.value)
