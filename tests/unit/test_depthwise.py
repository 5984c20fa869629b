"""Depth-wise batching (looplab/generation/depthwise.py): rows at different loops of different tokens in one
core call give the step-synchronous decoder's tokens, depths and log-probabilities (float64) on every
placement and injection, every position scheme and a window, a retrofit, rows that finish early, a
kl exit and an exit that carries state across checks; sampling is reproducible by its seed; what it does
not take is refused in one line."""

from __future__ import annotations

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import GenerationExit, Sampling, generate
from looplab.generation.options import DecodeOptions
from tests.unit.model_helpers import make_model, tiny_llama_retrofit
from tests.unit.test_speculative import NEW, PROMPTS, STRUCTURES  # mixed prompt lengths; 16 placements × injections

#: thresholds that put these random models' tokens at one depth, or at several (measured per structure)
EXITS = [GenerationExit("fixed", 5)] + [GenerationExit("convergence", 8, {"eps": eps}) for eps in (0.05, 0.2, 0.5)]


def _causal(**overrides):
    return make_model(**{**dict(causal=True, core_layers=2, max_len=96), **overrides})


def _assert_same(model, prompts, rule, finished=None):
    step = generate(model, prompts, NEW, DecodeOptions(rule, "per_loop"), finished)
    depth = generate(model, prompts, NEW, DecodeOptions(rule, "per_loop", decoder="depth"), finished)
    assert depth.tokens == step.tokens
    assert depth.depths == step.depths
    for ours, theirs in zip(depth.logprobs, step.logprobs, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-9)
    return depth


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: f"{s['placement']}-{s['injection']}")
def test_depth_wise_batching_is_the_step_decoder_on_every_structure(structure):
    model = _causal(**structure, prelude_layers=1, coda_layers=1)
    depths = set()
    for rule in EXITS:
        depths |= {d for row in _assert_same(model, PROMPTS, rule).depths for d in row}
    assert depths >= {5}


@pytest.mark.parametrize(
    "rule", [GenerationExit("kl", 8, {"eps": 0.01}), GenerationExit("convergence", 8, {"eps": 0.05})]
)
def test_a_query_token_that_runs_past_loop_one_is_a_token_in_flight(rule, monkeypatch):
    """A lazy prefill runs loop 1 alone: a prompt whose last token runs on is handed to the decode calls, which
    run its prompt's next loops beside the other rows' tokens and read the query there (rows waiting for a
    free row, too): the step decoder's tokens, depths and log-probabilities."""
    from looplab.generation import depthwise

    handed, query_loops = [], []
    hand_on, loop = depthwise.DepthwiseDecoder._hand_on, depthwise.DepthwiseDecoder._loop

    def counted_hand_on(self, state, rows, logits, depths):
        handed.append(0 if self.handed is None else int(self.handed.running.sum()))
        return hand_on(self, state, rows, logits, depths)

    def counted_loop(self, state, rows):
        query_loops.append(int(state.query[rows].sum()))
        return loop(self, state, rows)

    monkeypatch.setattr(depthwise.DepthwiseDecoder, "_hand_on", counted_hand_on)
    monkeypatch.setattr(depthwise.DepthwiseDecoder, "_loop", counted_loop)
    model = _causal(placement="post_sandwich", injection="contractive")
    step = generate(model, PROMPTS, NEW, DecodeOptions(rule))
    depth = generate(model, PROMPTS, NEW, DecodeOptions(rule, decoder="depth", decoder_params={"max_batch": 2}))
    assert depth.tokens == step.tokens and depth.depths == step.depths
    for ours, theirs in zip(depth.logprobs, step.logprobs, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-9)
    assert max(row[0] for row in step.depths) > 1  # some query tokens run past loop 1
    assert len(handed) > 1 and sum(handed) > 0 and sum(query_loops) > 0  # (the first prefill's and later ones')


def test_rows_at_many_depths_share_calls_and_finish_apart():
    """A structure whose tokens exit at five depths: rows drift apart (a row's tokens are at different
    positions from the others' in one call), rows that finish early leave, and it all equals the step decoder."""
    model = _causal(placement="post_sandwich", injection="add", prelude_layers=1, coda_layers=1)
    rule = GenerationExit("convergence", 8, {"eps": 0.05})
    out = _assert_same(model, PROMPTS, rule)
    assert len({d for row in out.depths for d in row}) >= 4
    sums = [sum(row) for row in out.depths]
    assert len(set(sums)) > 1  # rows spent different numbers of loops on the same number of tokens
    stop_token = out.tokens[1][2]
    finished = _assert_same(model, PROMPTS, rule, finished=lambda ids: ids[-1] == stop_token)
    assert finished.tokens[1][-1] == stop_token and len(finished.tokens[1]) <= 3


@pytest.mark.parametrize("positional, window", [("rope", 0), ("learned", 0), ("nope", 0), ("rope", 3)])
def test_every_position_scheme_and_a_window(positional, window):
    model = _causal(positional=positional, attention_window=window, injection="contractive")
    for rule in (GenerationExit("fixed", 4), GenerationExit("convergence", 8, {"eps": 0.2})):
        _assert_same(model, PROMPTS, rule)


def test_an_exit_that_reads_the_logits_of_every_loop():
    model = _causal(injection="contractive")
    out = _assert_same(model, PROMPTS, GenerationExit("kl", 8, {"eps": 0.01}))
    assert len({d for row in out.depths for d in row}) >= 4


def test_an_exit_that_carries_state_across_checks():
    """argmax-stability counts a token's loops: each row in flight keeps its own count, restarted per token."""
    model = _causal(injection="contractive")
    out = _assert_same(model, PROMPTS, GenerationExit("argmax-stability", 8, {"steps": 2}))
    assert len({d for row in out.depths for d in row}) >= 2 and min(d for row in out.depths for d in row) >= 3


def test_a_retrofit_with_grouped_keys_and_values():
    pytest.importorskip("transformers")
    retrofit = tiny_llama_retrofit()
    for rule in (GenerationExit("fixed", 4), GenerationExit("convergence", 8, {"eps": 0.1})):
        _assert_same(retrofit, PROMPTS, rule)


def test_sampling_is_reproducible_by_its_seed():
    model = _causal(injection="contractive")
    rule = GenerationExit("convergence", 8, {"eps": 0.2})
    runs = [
        generate(
            model, PROMPTS, NEW, DecodeOptions(rule, sampling=Sampling(temperature=1.0, seed=seed), decoder="depth")
        )
        for seed in (5, 5, 6)
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].depths == runs[1].depths
    assert runs[0].tokens != runs[2].tokens


@pytest.mark.parametrize(
    "model_kind, cache, batching, message",
    [
        ("looplab", "shared", "depth", "the depth decoder decodes through the per_loop cache, not shared"),
        ("looplab", "last_m", "depth", "the depth decoder decodes through the per_loop cache, not last_m"),
        ("looplab", "per_loop", "loop", "unknown decoder 'loop'; valid choices: depth, recompute, speculative, step"),
        ("hrm_text", "per_loop", "depth", "chains of pre-norm layers, which HRM-Text is not: valid models: a looplab"),
    ],
)
def test_what_depth_wise_batching_does_not_take_is_one_line(model_kind, cache, batching, message):
    if model_kind == "hrm_text":
        pytest.importorskip("transformers")
        from looplab.lm.hrm_text import HrmTextLoop
        from tests.lm_dirs import tiny_model

        model = HrmTextLoop(tiny_model("hrm_text")).eval()
    else:
        model = _causal()
    with pytest.raises(LooplabError) as err:
        generate(model, PROMPTS, 4, DecodeOptions(GenerationExit("fixed", 4), cache, decoder=batching))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "structure, rule",
    [
        (dict(injection="add", prelude_layers=1, coda_layers=1), GenerationExit("convergence", 8, {"eps": 0.05})),
        (dict(injection="contractive"), GenerationExit("kl", 8, {"eps": 0.01})),  # no coda: lazy prompts
    ],
    ids=["coda", "lazy-prompt"],
)
def test_waiting_prompts_take_the_rows_of_finished_ones(structure, rule):
    """``max_batch`` rows decode more prompts: each prompt's tokens, depths and log-probabilities are what it
    gets in one batch with all the others, whichever row it took and whatever that row held before (a
    model without a coda runs each prompt only as deep as its tokens need, deepening it on demand)."""
    model = _causal(placement="post_sandwich", **structure)
    prompts = PROMPTS + [[2, 6, 1], [5], [3, 3, 4, 1, 6, 2, 5, 4, 1], [6, 2]]
    whole = generate(model, prompts, NEW, DecodeOptions(rule))

    def stop_early(ids):
        return len(ids) == 4 and ids[0] % 2 == 0  # some prompts end early, so rows free at different times

    early = generate(model, prompts, NEW, DecodeOptions(rule), stop_early)
    for max_batch in (1, 3, 8):
        for reference, finished in ((whole, None), (early, stop_early)):
            out = generate(
                model,
                prompts,
                NEW,
                DecodeOptions(rule, decoder="depth", decoder_params={"max_batch": max_batch}),
                finished,
            )
            assert out.tokens == reference.tokens and out.depths == reference.depths
            for ours, theirs in zip(out.logprobs, reference.logprobs, strict=True):
                assert ours == pytest.approx(theirs, abs=1e-9)
    assert len({len(row) for row in early.tokens}) > 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(decoder_params={"max_batch": 2}), "unknown parameter of the step decoder 'max_batch'"),
        (
            dict(decoder="depth", decoder_params={"max_batch": -1}),
            "decoder.depth.max_batch must be in [0, inf), got -1",
        ),
        (dict(decoder="depth", cache="shared"), "the depth decoder decodes through the per_loop cache, not shared"),
    ],
)
def test_a_bad_max_batch_is_one_line(kwargs, message):
    with pytest.raises(LooplabError) as err:
        generate(_causal(), PROMPTS, 4, DecodeOptions(GenerationExit("fixed", 4), **kwargs))
    assert message in str(err.value) and "\n" not in str(err.value)


def _stops_on_even_loops(rule, t, h, h_prev, logp, logp_prev):
    """An exit whose test reads only its loop number: stop after an even loop."""
    return torch.full((h.shape[0],), t % 2 == 0)


@pytest.mark.parametrize(
    "rule",
    [
        GenerationExit("kl", 6, {"eps": 0.05}),
        GenerationExit("convergence", 6, {"eps": 0.5}),
        GenerationExit("confidence", 6, {"threshold": 0.5}),
        GenerationExit("fixed", 3),
        GenerationExit("argmax-stability", 6, {"steps": 2}),
        "even_loops",
    ],
    ids=lambda r: r if isinstance(r, str) else r.name,
)
def test_check_rows_is_check_row_by_row(monkeypatch, rule):
    """Rows after different loops tested in one call give what each row's own ``check(t, ...)`` gives, the
    state an exit carries across checks included; an exit that reads t (the default for a plugin) is tested
    per loop."""
    from looplab.token_exits import EXITS, TokenExit

    if rule == "even_loops":
        monkeypatch.setitem(EXITS, rule, TokenExit(rule, False, 1, _stops_on_even_loops))
        rule = GenerationExit(rule, 6)
    generator = torch.Generator().manual_seed(0)
    rows = 24
    loops = torch.arange(rows) % 7 + 1  # loops 1..7, past the cap too
    h, h_prev = torch.randn(rows, 8, generator=generator), torch.randn(rows, 8, generator=generator)
    logp = torch.randn(rows, 5, generator=generator).log_softmax(-1)
    logp_prev = (logp + 0.3 * torch.randn(rows, 5, generator=generator)).log_softmax(-1)
    carried = rule.start(rows, h.device)
    if carried is not None:  # a state mid-token: half the rows' last argmax is this loop's, stood 0..2 checks
        carried[:, 0] = torch.where(torch.arange(rows) % 2 == 0, logp.argmax(-1), -1)
        carried[:, 1] = torch.arange(rows) % 3
    together, after = rule.check_rows(loops, h, h_prev, logp, logp_prev, carried)
    alone = []
    for i, t in enumerate(loops.tolist()):
        row = slice(i, i + 1)
        earlier = None if t == 1 else logp_prev[row]
        stop, state = rule.check(t, h[row], h_prev[row], logp[row], earlier, None if carried is None else carried[row])
        alone.append(bool(stop))
        assert carried is None or torch.equal(state, after[row])
    assert together.tolist() == alone
    assert 0 < sum(alone) < rows  # the test decides both ways
