"""Generation: cached decoding equals recomputation, batches equal single prompts, exits match a reference loop."""

from __future__ import annotations

import itertools

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import GenerationExit, Sampling, generate, score
from looplab.generation.byte_text import decode, encode
from looplab.generation.options import DecodeOptions
from looplab.generation.text import cut_at_stop, unescape
from tests.unit.model_helpers import make_model

PROMPTS = [[3, 5, 6, 2, 1], [3, 4], [3, 4, 4, 6, 1, 5, 2, 2]]
ONE_TOKEN_PROMPTS = [[3], [3]]

STRUCTURES = [
    dict(placement=placement, injection=injection)
    for placement, injection in itertools.product(
        ("pre", "post", "pre_sandwich", "post_sandwich"), ("add", "concat", "contractive", "none")
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
    cached = generate(model, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 3), "per_loop"))
    uncached = generate(model, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 3), "none"))
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
    result = generate(
        model, PROMPTS[:2], 5, DecodeOptions(GenerationExit("fixed", 4), "per_loop", Sampling(temperature=1.5, seed=3))
    )
    replay = generate(
        model, PROMPTS[:2], 5, DecodeOptions(GenerationExit("fixed", 4), "none", Sampling(temperature=1.5, seed=3))
    )
    assert result.tokens == replay.tokens
    from looplab.generation.step import Decoder

    decoder = Decoder(model, [PROMPTS[0]], 1, DecodeOptions(GenerationExit("fixed", 4)))
    rows = torch.arange(1)
    logits, _ = decoder.forward(decoder.tokens, rows, slice(0, decoder.width), decoder.lengths - 1, prefill=True)
    assert torch.allclose(logits[0], reference_logits(model, PROMPTS[0], 4), atol=1e-10)


@pytest.mark.parametrize("cache", ["per_loop", "shared", "last_m"])
@pytest.mark.parametrize("exit_name", ["fixed", "convergence", "confidence"])
def test_a_batch_of_mixed_lengths_equals_each_prompt_alone(cache, exit_name):
    model = causal_model(placement="post_sandwich", norm="rmsnorm")
    rule = GenerationExit(exit_name, 8, {"convergence": {"eps": 0.05}, "confidence": {"threshold": 0.2}}.get(exit_name))
    together = generate(model, PROMPTS, 5, DecodeOptions(rule, cache))
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], 5, DecodeOptions(rule, cache))
        assert alone.tokens[0] == together.tokens[row]
        assert alone.depths[0] == together.depths[row]


def test_exit_depths_equal_a_reference_loop():
    """Convergence exit with the per-loop cache: each token's depth is the first loop at which its
    relative step falls below eps, computed here by recomputing the whole sequence loop by loop."""
    model = causal_model(placement="pre", injection="add")
    rule = GenerationExit("convergence", 30, {"eps": 0.1})
    result = generate(model, [PROMPTS[0]], 6, DecodeOptions(rule, "per_loop"))
    depths = result.depths[0]
    assert max(depths) < 30 and len(set(depths)) > 1, depths
    # the first token's depth depends on the prompt alone, which every loop computes exactly
    tokens = torch.tensor([PROMPTS[0]])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    states = [h[0, -1] for h, _ in model.unroll(tokens, valid, 30)]
    expected = next(
        t
        for t in range(2, 31)
        if (states[t - 1] - states[t - 2]).norm() < rule.params.eps * states[t - 1].norm() or t == 30
    )
    assert depths[0] == expected


@pytest.mark.parametrize("cache", ["per_loop", "shared", "last_m"])
def test_the_prefill_runs_to_the_cap_whatever_the_exit(cache):
    """The prompt's keys and values at every loop up to the cap are what a fixed-cap prefill writes,
    even when the exit stops every prompt's last token at loop 1."""
    from looplab.generation.step import Decoder

    model = causal_model()
    caches = []
    for rule in (GenerationExit("fixed", 6), GenerationExit("confidence", 6, {"threshold": 1e-9})):
        decoder = Decoder(model, PROMPTS, 1, DecodeOptions(rule, cache))
        decoder.lazy_prompt = False  # per_loop's lazy prompt is checked against this below
        _, depths = decoder.forward(
            decoder.tokens, torch.arange(len(PROMPTS)), slice(0, decoder.width), decoder.lengths - 1, prefill=True
        )
        caches.append(decoder.cache.layers)
    assert depths.tolist() == [1, 1, 1]
    assert caches[0].keys() == caches[1].keys()
    for key, layer in caches[0].items():
        assert torch.equal(layer.k, caches[1][key].k) and torch.equal(layer.v, caches[1][key].v), key


def test_a_lazy_prompt_gives_what_prefilling_to_the_cap_gives(monkeypatch):
    """per_loop with an adaptive exit runs the prompt only as deep as its tokens need and deepens it on
    demand, in the core calls of the token that needs it: the same tokens, depths and log-probabilities as a
    prompt run to the cap first, with fewer loops run when no token goes to the cap."""
    from looplab.generation import step as decoder_module

    model = causal_model(placement="pre", injection="add", prelude_layers=1)
    rule = GenerationExit("halting", 12, halts=linear_halts(7, every=2))  # first tokens stop at 2, later ones at 12
    prompts = PROMPTS[:2]
    runs = {}
    for lazy in (True, False):
        calls = []  # the loops the prompts are deepened to: alone, or ("in a step") in a step's core call
        original, fused = decoder_module.Decoder.deepen_prompt, decoder_module.fused_core_pass

        def counted(self, rows, loop, original=original, calls=calls):
            calls.append(loop)
            return original(self, rows, loop)

        def counted_parts(model, parts, calls=calls, fused=fused):
            calls.extend(("in a step", part.loop) for _, _, part in parts[:-1])
            return fused(model, parts)

        monkeypatch.setattr(decoder_module.Decoder, "deepen_prompt", counted)
        monkeypatch.setattr(decoder_module, "fused_core_pass", counted_parts)
        decoder = decoder_module.Decoder(model, prompts, 6, DecodeOptions(rule))
        decoder.lazy_prompt = lazy
        runs[lazy] = (decoder.run(), calls)
    (lazy_run, deepened), (eager_run, never) = runs[True], runs[False]
    assert lazy_run.tokens == eager_run.tokens and lazy_run.depths == eager_run.depths
    flat = [lp for row in lazy_run.logprobs for lp in row]
    assert flat == pytest.approx([lp for row in eager_run.logprobs for lp in row], abs=1e-10)
    assert never == [] and deepened and len({d for row in lazy_run.depths for d in row}) > 1
    # one loop behind at each loop of a step, a prompt runs it in the step's core call, never in a pass of its own
    assert all(isinstance(call, tuple) for call in deepened)
    loops = [loop for _, loop in deepened]
    assert loops == sorted(loops) and max(loops) <= max(d for row in lazy_run.depths for d in row)


@pytest.mark.parametrize("structure", STRUCTURES[::3], ids=lambda s: f"{s['placement']}-{s['injection']}")
def test_masked_and_gathered_loops_give_each_prompt_alone(structure, monkeypatch):
    """A decode step's loop that some rows no longer need runs every row with their cache writes masked
    (MASK_AT 0) or the running rows alone (MASK_AT ∞): both give what each prompt gives alone."""
    from looplab.generation import step as decoder_module

    model = causal_model(prelude_layers=1, **structure)
    weight = torch.randn(16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    # a bar that falls with the loop, so tokens halt at different loops whatever the scale of h
    rule = GenerationExit("halting", 7, halts=lambda h, t: (h @ weight) / h.norm(dim=-1) > 0.6 - 0.2 * t)
    prompts = [*PROMPTS, [3, 6, 6, 1]]
    runs = {}
    for at in (0.0, float("inf")):
        monkeypatch.setattr(decoder_module, "MASK_AT", at)
        runs[at] = generate(model, prompts, 6, DecodeOptions(rule, "per_loop"))
    assert len({d for row in runs[0.0].depths for d in row}) > 1  # rows exit at different loops
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], 6, DecodeOptions(rule, "per_loop"))
        for run in runs.values():
            assert run.tokens[row] == alone.tokens[0] and run.depths[row] == alone.depths[0]
            assert run.logprobs[row] == pytest.approx(alone.logprobs[0], abs=1e-10)


def test_one_token_prompts_are_prefilled_to_the_cap():
    model = causal_model()
    cached = generate(model, ONE_TOKEN_PROMPTS, 4, DecodeOptions(GenerationExit("fixed", 3), "per_loop"))
    assert (
        cached.tokens == generate(model, ONE_TOKEN_PROMPTS, 4, DecodeOptions(GenerationExit("fixed", 3), "none")).tokens
    )
    adaptive = generate(
        model, ONE_TOKEN_PROMPTS, 4, DecodeOptions(GenerationExit("confidence", 5, {"threshold": 1e-9}), "per_loop")
    )
    assert [row[0] for row in adaptive.depths] == [1, 1]


def test_adaptive_exit_with_a_cap_of_one_is_the_fixed_depth():
    model = causal_model()
    fixed = generate(model, PROMPTS, 4, DecodeOptions(GenerationExit("fixed", 1), "per_loop"))
    for name in ("convergence", "kl", "confidence"):
        adaptive = generate(model, PROMPTS, 4, DecodeOptions(GenerationExit(name, 1), "per_loop"))
        assert adaptive.tokens == fixed.tokens and {d for row in adaptive.depths for d in row} == {1}


def test_shared_cache_at_one_loop_equals_per_loop():
    """With one loop there is one loop's keys and values: the policies coincide."""
    model = causal_model(placement="pre_sandwich")
    a = generate(model, PROMPTS, 5, DecodeOptions(GenerationExit("fixed", 1), "per_loop"))
    b = generate(model, PROMPTS, 5, DecodeOptions(GenerationExit("fixed", 1), "shared"))
    assert a.tokens == b.tokens


def linear_halts(seed: int, every: int = 1):
    """A halting decision from a random linear head: halt when h·w > 0, at loops that are multiples of ``every``."""
    weight = torch.randn(16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return lambda h, t: (h @ weight > 0) & torch.tensor(t % every == 0)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "halting"])
def test_last_m_spans_shared_to_per_loop(adaptive):
    """Keeping one loop per token is the shared cache; keeping as many as the cap is per_loop (whose
    lending of an early exit's entries the window's clamp reproduces)."""
    model = causal_model(placement="pre", injection="add", prelude_layers=1)
    rule = GenerationExit("halting", 6, halts=linear_halts(1)) if adaptive else GenerationExit("fixed", 6)
    for keep, policy in ((1, "shared"), (6, "per_loop"), (9, "per_loop")):
        window = generate(model, PROMPTS, 6, DecodeOptions(rule, "last_m", cache_params={"keep_loops": keep}))
        other = generate(model, PROMPTS, 6, DecodeOptions(rule, policy))
        assert window.tokens == other.tokens and window.depths == other.depths, (keep, policy)
        flat = [lp for row in window.logprobs for lp in row]
        assert flat == pytest.approx([lp for row in other.logprobs for lp in row], abs=1e-10)
    if adaptive:
        assert len({d for row in window.depths for d in row}) > 2  # tokens exited at several depths


@torch.no_grad()
def test_last_m_reads_the_kept_loops_of_earlier_tokens():
    """At fixed depth T with m kept loops, a new token at loop t reads earlier tokens at loop
    max(t, T − m + 1): the same as recomputing with those tokens' keys and values, checked here
    against an explicit per_loop cache whose early loops are overwritten with loop T − m + 1."""
    from looplab.generation.step import Decoder

    model = causal_model(placement="pre", injection="add")
    keep, loops = 2, 5
    window = generate(
        model,
        [PROMPTS[2]],
        1,
        DecodeOptions(GenerationExit("fixed", loops), "last_m", cache_params={"keep_loops": keep}),
    )
    decoder = Decoder(model, [PROMPTS[2]], 1, DecodeOptions(GenerationExit("fixed", loops)))
    rows = torch.arange(1)
    decoder.forward(decoder.tokens, rows, slice(0, decoder.width), decoder.lengths - 1, prefill=True)
    for (site, loop, index), layer in decoder.cache.layers.items():
        if site == "core" and loop < loops - keep + 1:
            kept = decoder.cache.layers[(site, loops - keep + 1, index)]
            layer.k.copy_(kept.k)
            layer.v.copy_(kept.v)
    # the prompt's own logits are read at the cap either way; the second token is where the window shows
    second = generate(
        model,
        [PROMPTS[2]],
        2,
        DecodeOptions(GenerationExit("fixed", loops), "last_m", cache_params={"keep_loops": keep}),
    )
    decoder.slots.positions[0, decoder.width] = decoder.lengths[0]
    decoder.slots.real[0, decoder.width] = True
    token = torch.tensor([[window.tokens[0][0]]])
    logits, _ = decoder.forward(token, rows, slice(decoder.width, decoder.width + 1), torch.zeros(1, dtype=torch.long))
    assert int(logits[0].argmax()) == second.tokens[0][1]
    assert float(logits[0].log_softmax(-1)[second.tokens[0][1]]) == pytest.approx(second.logprobs[0][1], abs=1e-10)


def test_last_m_memory_is_its_window_whatever_the_depth():
    model = causal_model()
    sizes = [
        generate(
            model, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", k), "last_m", cache_params={"keep_loops": 2})
        ).cache_bytes
        for k in (2, 8)
    ]
    per_loop_two = generate(model, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", 2), "per_loop")).cache_bytes
    assert sizes[0] == sizes[1] == per_loop_two


def test_last_m_holds_at_most_the_caps_loops():
    """A window longer than the cap holds the cap's loops, not the window's: the same tokens in the same memory."""
    model = causal_model()
    runs = [
        generate(model, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", 4), "last_m", cache_params={"keep_loops": k}))
        for k in (4, 4096)
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].cache_bytes == runs[1].cache_bytes


@pytest.mark.parametrize("cache", ["per_loop", "none"])
def test_score_is_the_teacher_forced_log_likelihood(cache):
    """Scoring at a fixed depth gives each token the log-probability the whole-sequence forward pass gives it."""
    model = causal_model(placement="pre_sandwich", prelude_layers=1)
    sequences = [[3, 5, 6, 2, 1, 4], [3, 4, 6]]
    result = score(model, sequences, DecodeOptions(GenerationExit("fixed", 3), cache))
    for sequence, logprobs, depths in zip(sequences, result.logprobs, result.depths):
        tokens = torch.tensor([sequence])
        with torch.no_grad():
            logp = model(tokens, torch.ones_like(tokens, dtype=torch.bool), 3)[0].log_softmax(-1)
        expected = [float(logp[i, sequence[i + 1]]) for i in range(len(sequence) - 1)]
        assert logprobs == pytest.approx(expected, abs=1e-10)
        assert depths == [3] * (len(sequence) - 1)
    assert result.tokens == [s[1:] for s in sequences]
    flat = [lp for row in result.logprobs for lp in row]
    assert result.mean_loss == pytest.approx(-sum(flat) / len(flat))


def test_halting_exit_depths_follow_the_head_at_its_decision_loops():
    """The halting exit stops a token at the first decision loop (a multiple of 2 here) where the
    head's logit on its state is > 0: checked against a reference loop over the recomputed unroll."""
    model = causal_model(placement="pre", injection="add")
    halts = linear_halts(1, every=2)
    rule = GenerationExit("halting", 12, halts=halts)
    result = generate(model, [PROMPTS[0]], 6, DecodeOptions(rule, "per_loop"))
    depths = result.depths[0]
    assert all(d % 2 == 0 or d == 12 for d in depths) and len(set(depths)) > 1, depths
    tokens = torch.tensor([PROMPTS[0] + result.tokens[0][:-1]])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    states = [h[0, len(PROMPTS[0]) - 1] for h, _ in model.unroll(tokens, valid, 12)]
    expected = next(t for t in range(1, 13) if bool(halts(states[t - 1][None], t)[0]) or t == 12)
    assert depths[0] == expected


def test_shared_cache_memory_does_not_grow_with_depth():
    model = causal_model()
    per_loop = [
        generate(model, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", k), "per_loop")).cache_bytes for k in (2, 8)
    ]
    shared = [
        generate(model, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", k), "shared")).cache_bytes for k in (2, 8)
    ]
    assert per_loop[1] == 4 * per_loop[0]
    assert shared[0] == shared[1] < per_loop[0]


def test_sampling_is_reproducible_from_its_seed_and_top_k_one_is_greedy():
    model = causal_model()
    draws = [
        generate(model, PROMPTS, 8, DecodeOptions(GenerationExit("fixed", 2), "per_loop", Sampling(1.0, 0, seed)))
        for seed in (0, 0, 1)
    ]
    assert draws[0].tokens == draws[1].tokens
    assert draws[0].tokens != draws[2].tokens
    greedy = generate(model, PROMPTS, 8, DecodeOptions(GenerationExit("fixed", 2), "per_loop"))
    top1 = generate(model, PROMPTS, 8, DecodeOptions(GenerationExit("fixed", 2), "per_loop", Sampling(5.0, 1, 7)))
    assert top1.tokens == greedy.tokens


def test_a_finished_row_stops_and_the_others_go_on():
    model = causal_model()
    free = generate(model, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 2), "per_loop"))
    stop_after_two = generate(
        model, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 2), "per_loop"), lambda ids: len(ids) >= 2
    )
    assert [len(row) for row in stop_after_two.tokens] == [2, 2, 2]
    assert [row[:2] for row in free.tokens] == stop_after_two.tokens


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda m: generate(m, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", 2), "per_layer")),
            "valid choices: last_m, none, per_loop, shared",
        ),
        (
            lambda m: generate(
                m, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", 2), "last_m", cache_params={"keep_loops": 0})
            ),
            "cache.last_m.keep_loops must be in [1, 4096], got 0",
        ),
        (lambda m: generate(m, PROMPTS, 3, forced=[[4]]), "forced tokens must be given for each of the 3"),
        (
            lambda m: generate(m, PROMPTS, 3, DecodeOptions(GenerationExit("halting", 4))),
            "needs the run's halting head",
        ),
        (lambda m: score(m, [[3, 4], [3]]), "more than its 1 context token"),
        (lambda m: generate(m, [[3, 99]], 2), "token ids must be in 0..6"),
        (lambda m: score(m, [[3, 4, -1]]), "token ids must be in 0..6"),
        (lambda m: generate(m, PROMPTS, 3, DecodeOptions(GenerationExit("kl", 4), "none")), "use the fixed exit"),
        (lambda m: generate(m, [[]], 3), "at least one token"),
        (lambda m: generate(m, PROMPTS, 0), "max new tokens must be in 1.."),
        (lambda m: generate(m, PROMPTS, 10**9), "max new tokens must be in 1.."),
        (
            lambda m: generate(causal_model(positional="learned"), [[3] * 60], 10),
            "max new tokens must be in 1..4 for prompts of up to 60 tokens (learned positions end at 64 (max_len)",
        ),
        (
            lambda m: generate(causal_model(positional="learned"), [[3], [3] * 70], 1),
            "prompts[1]: its 70 tokens leave no room for new ones (learned positions end at 64 (max_len)): "
            "prompts of at most 63 tokens fit with 1 new",
        ),
        (lambda m: generate(m, [[3] * 10**6], 1, sources=["f.txt line 2"]), "f.txt line 2: its 1000000 tokens"),
        (
            lambda m: generate(causal_model(positional="rope"), [[3] * 65], 1),
            "prompts[0]: its 65 tokens leave no room for new ones (the model's positions end at 64 (max_len))",
        ),
        (
            lambda m: GenerationExit("halt"),
            "unknown generation exit 'halt'; valid choices: argmax-stability, confidence, convergence",
        ),
        (lambda m: GenerationExit("fixed", 0), "must be in 1..4096, got 0"),
        (lambda m: GenerationExit("fixed", 10**7), "must be in 1..4096, got 10000000"),
        (lambda m: GenerationExit("confidence", 4, {"threshold": 1.5}), "confidence.threshold must be in (0, 1]"),
        (lambda m: GenerationExit("kl", 4, {"eps": float("nan")}), "generate.exits.kl.eps must be in (0, inf)"),
        (lambda m: GenerationExit("kl", 4, {"eps": float("inf")}), "generate.exits.kl.eps must be in (0, inf)"),
        (lambda m: GenerationExit("kl", 4, {"epsilon": 1}), "unknown key in [generate.exits.kl] 'epsilon'"),
        (lambda m: GenerationExit("fixed", 4, {"eps": 1}), "valid choices: (none: it has no parameters)"),
        (lambda m: Sampling(temperature=-1), "sampling.temperature must be in [0, inf)"),
        (lambda m: Sampling(temperature=float("inf")), "sampling.temperature must be in [0, inf), got inf"),
        (lambda m: Sampling(temperature=float("nan")), "sampling.temperature must be in [0, inf), got nan"),
        (lambda m: Sampling(top_k=-1), "sampling.top_k must be in [0, inf)"),
        (lambda m: Sampling(seed=2**64), "sampling.seed must be in"),
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


def test_decoded_answers_are_scored_whole_and_per_token():
    """A problem counts when the decoded text is its answer exactly; each answer token is scored at its
    position. Checked with answers taken from the model's own greedy decoding, then one digit changed."""
    from looplab.config import ModelConfig
    from looplab.generation.reasoning import decode_answers
    from looplab.model import LoopedTransformer
    from looplab.tasks.reasoning import ChainTrace

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, mlp_ratio=2, core_layers=1, causal=True, max_len=64)
    model = LoopedTransformer(cfg, ChainTrace().vocab_size).to(torch.float64)
    problems = ChainTrace().draw(3, 4, torch.Generator().manual_seed(1))
    rule = GenerationExit("fixed", 2)
    own = decode_answers(model, problems, DecodeOptions(rule))
    assert [len(c) for c in own.token_correct] == [len(a) for _, a in problems] == [4] * 4
    assert own.tokens == sum(map(len, own.depths)) and own.mean_depth == 2.0
    # the model's own greedy text as the answer (padded to its length) is right wherever it is complete
    echoed = [(q, (text + "0000")[:3] + "\n") for (q, _), text in zip(problems, own.texts)]
    again = decode_answers(model, echoed, DecodeOptions(rule))
    for text, answer, right, tokens in zip(again.texts, echoed, again.correct, again.token_correct):
        assert right == (text == answer[1])
        assert tokens[0] == (text[:1] == answer[1][:1])
    changed = [
        (q, chr(ord("0") + (int(a[0]) + 1) % 10) + a[1:]) if a[0].isdigit() else (q, "x" + a[1:]) for q, a in echoed
    ]
    worse = decode_answers(model, changed, DecodeOptions(rule))
    assert not any(row[0] for row in worse.token_correct) and not worse.correct.any()
    assert [p for p, *_ in again.by_position()] == [0, 1, 2, 3]
