"""Self-speculative decoding (looplab/generation/speculative.py): token-identical to fixed-K greedy decoding in
float64 on every placement and injection, batched with mixed prompt lengths, on a retrofit and HRM-Text too;
its drafts are partly kept (both branches run); bad arguments are one line."""

from __future__ import annotations

import itertools

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import GenerationExit, Sampling, generate
from looplab.generation.options import DecodeOptions
from tests.unit.model_helpers import make_model, tiny_llama_retrofit

#: mixed lengths, one of them a single token
PROMPTS = [[3, 5, 6, 2, 1], [3, 4], [3, 4, 4, 6, 1, 5, 2, 2], [1]]
NEW = 9
STRUCTURES = [
    dict(placement=placement, injection=injection)
    for placement, injection in itertools.product(
        ("pre", "post", "pre_sandwich", "post_sandwich"), ("add", "concat", "contractive", "none")
    )
]


def _causal(**overrides):
    return make_model(**{**dict(causal=True, core_layers=2, max_len=96), **overrides})


def _assert_identical(model, prompts, loops, draft_loops, draft_tokens, finished=None):
    fixed = generate(model, prompts, NEW, DecodeOptions(GenerationExit("fixed", loops), "per_loop"), finished)
    fast = generate(
        model,
        prompts,
        NEW,
        DecodeOptions(
            GenerationExit("fixed", loops),
            decoder="speculative",
            decoder_params={"draft_loops": draft_loops, "draft_tokens": draft_tokens},
        ),
        finished,
    )
    assert fast.tokens == fixed.tokens
    assert fast.depths == fixed.depths  # K for every token
    for ours, theirs in zip(fast.logprobs, fixed.logprobs):
        assert ours == pytest.approx(theirs, abs=1e-9)
    return fast


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: f"{s['placement']}-{s['injection']}")
def test_speculative_tokens_are_fixed_k_greedy_on_every_structure(structure):
    model = _causal(**structure, prelude_layers=1, coda_layers=1)
    for draft_loops, draft_tokens in ((1, 3), (2, 1), (3, 4)):
        fast = _assert_identical(model, PROMPTS, 4, draft_loops, draft_tokens)
        assert fast.drafted > 0 and 0 <= fast.accepted <= fast.drafted


@pytest.mark.parametrize("positional, window", [("rope", 0), ("learned", 0), ("nope", 0), ("rope", 3)])
def test_speculative_tokens_with_every_position_scheme_and_a_window(positional, window):
    model = _causal(positional=positional, attention_window=window)
    _assert_identical(model, PROMPTS, 5, 2, 4)


def test_both_branches_run_drafts_are_partly_kept():
    """Over several random models, some drafts are kept and some refused, so both paths of a round run."""
    kept = refused = 0
    for seed in range(4):
        fast = _assert_identical(_causal(seed=seed, core_layers=1), PROMPTS, 6, 1, 3)
        kept, refused = kept + fast.accepted, refused + fast.drafted - fast.accepted
    assert kept > 0 and refused > 0
    assert 0 < fast.acceptance <= 1 or fast.accepted == 0


def test_a_row_that_finishes_mid_round_stops_there():
    """``finished`` ends a row at the token that satisfies it, inside a round, as fixed-K decoding ends it."""
    model = _causal()
    fixed = generate(model, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 4), "per_loop"))
    stop_token = fixed.tokens[0][2]

    def done(ids):
        return ids[-1] == stop_token

    fast = _assert_identical(model, PROMPTS, 4, 2, 4, finished=done)
    assert fast.tokens[0][-1] == stop_token and len(fast.tokens[0]) <= 3


def test_speculative_on_a_retrofit_and_hrm_text():
    pytest.importorskip("transformers")
    from tests.lm_dirs import tiny_model

    _assert_identical(tiny_llama_retrofit(), PROMPTS, 4, 2, 3)
    from looplab.lm.hrm_text import HrmTextLoop

    hrm = HrmTextLoop(tiny_model("hrm_text").to(torch.float64)).eval()
    _assert_identical(hrm, PROMPTS, 4, 1, 4)


@pytest.mark.parametrize(
    "params, sampling, message",
    [
        ({"draft_loops": 4}, Sampling(), "draft_loops must be in 1..3 (below the exit's 4 loops), got 4"),
        ({"draft_loops": 0}, Sampling(), "decoder.speculative.draft_loops must be in [1, inf), got 0"),
        ({"draft_tokens": 0}, Sampling(), "decoder.speculative.draft_tokens must be in [1, 64], got 0"),
        ({"draft_tokens": 1_000_000}, Sampling(), "decoder.speculative.draft_tokens must be in [1, 64], got 1000000"),
        ({}, Sampling(temperature=0.7), "the speculative decoder is greedy: use temperature 0, not 0.7"),
    ],
)
def test_bad_speculative_arguments_are_one_line(params, sampling, message):
    with pytest.raises(LooplabError) as err:
        options = DecodeOptions(GenerationExit("fixed", 4), sampling=sampling, decoder="speculative",
                                decoder_params={"draft_loops": 2, "draft_tokens": 3} | params)  # fmt: skip
        generate(_causal(), PROMPTS, 4, options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_drafts_past_a_learned_position_tables_end_are_never_read_there():
    """A valid request whose last round drafts past max_len: the tokens are fixed K's, no index error."""
    model = _causal(positional="learned", max_len=24)
    prompts = [[3] * 10, [4] * 17]
    fast = generate(
        model,
        prompts,
        24 - 17,
        DecodeOptions(
            GenerationExit("fixed", 4), decoder="speculative", decoder_params={"draft_loops": 1, "draft_tokens": 8}
        ),
    )
    fixed = generate(model, prompts, 24 - 17, DecodeOptions(GenerationExit("fixed", 4), "per_loop"))
    assert fast.tokens == fixed.tokens


def test_a_speculative_generation_too_large_to_hold_is_refused_before_allocating(monkeypatch):
    import looplab.memory

    monkeypatch.setattr(looplab.memory, "device_bytes", lambda device: 2**20)
    with pytest.raises(LooplabError, match="holds 4096 cache slots per row, an estimated"):
        generate(
            _causal(max_len=4096),
            PROMPTS,
            64,
            DecodeOptions(
                GenerationExit("fixed", 4), decoder="speculative", decoder_params={"draft_loops": 2, "draft_tokens": 64}
            ),
        )
