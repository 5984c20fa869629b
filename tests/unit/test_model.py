"""The looped transformer: per-row depths vs the naive unroll, the recurrence, injection and norms."""

from __future__ import annotations

import itertools

import pytest
import torch

from looplab.config import INIT_STATES, INJECTIONS, NORMS
from looplab.model import LoopedTransformer
from looplab.model.placements import PLACEMENTS
from tests.unit.model_helpers import VOCAB, assert_close_on, gen, make_batch, make_model, randomise


def naive_states(model, tokens, valid, loops, generator=None):
    states, ctx = [], None
    for h, ctx in model.unroll(tokens, valid, loops, generator):  # noqa: B007 (the last ctx is returned)
        states.append(h)
    return torch.stack(states), ctx  # [T, B, L, d]


def naive_at_depths(model, tokens, valid, depths, generator=None):
    """[B] depths → [B, L, V]; [B, J] → [B, J, L, V] (unused slots left as NaN)."""
    single = depths.dim() == 1
    d2 = depths.view(depths.shape[0], -1)
    states, ctx = naive_states(model, tokens, valid, int(d2.max()), generator)
    rows = torch.arange(d2.shape[0])
    out = []
    for j in range(d2.shape[1]):
        picked = states[(d2[:, j] - 1).clamp_min(0), rows]
        logits = model.readout(picked, ctx)
        unused = (d2[:, j] <= 0)[:, None, None]
        out.append(torch.where(unused, torch.full_like(logits, float("nan")), logits))
    out = torch.stack(out, dim=1)
    return out[:, 0] if single else out


# ----------------------------------------------------------------------------- per-row depths vs naive

STRUCTURES = list(itertools.product(NORMS, PLACEMENTS))
COMBOS = [
    (norm, placement, injection, init)
    for (norm, placement), injection, init in itertools.product(STRUCTURES, INJECTIONS, INIT_STATES)
]


def _variant(index: int) -> dict:
    """Vary prelude / coda / core depth / causality / positions across the combos."""
    return dict(
        prelude_layers=index % 2,
        coda_layers=(index // 2) % 2,
        core_layers=1 + (index // 3) % 2,
        causal=bool((index // 5) % 2),
        positional=("rope", "rope", "learned", "nope")[(index // 7) % 4],
        core_out_norm=(index % 11 == 0),
    )


@pytest.mark.parametrize("norm, placement, injection, init", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_forward_at_depths_matches_naive(norm, placement, injection, init):
    index = COMBOS.index((norm, placement, injection, init))
    model = make_model(
        seed=index,
        norm=norm,
        placement=placement,
        injection=injection,
        init_state=init,
        noise_std=0.5,
        **_variant(index),
    )
    tokens, valid = make_batch(seed=index)
    B = tokens.shape[0]
    answer = valid  # compare on valid positions

    # [B] depths, ties and a row of depth 1 included
    depths = torch.tensor([3, 1, 4, 2, 3])
    fast = model.forward_at_depths(tokens, valid, depths, generator=gen())
    slow = naive_at_depths(model, tokens, valid, depths, generator=gen())
    assert fast.shape == (B, tokens.shape[1], VOCAB)
    assert_close_on(fast, slow, answer)

    # [B, J] with unused slots (<= 0), a row with a single used slot, repeated depths
    multi = torch.tensor([[2, 0, 4], [1, -1, 0], [4, 3, 4], [0, 0, 2], [3, 2, 1]])
    fast = model.forward_at_depths(tokens, valid, multi, generator=gen())
    slow = naive_at_depths(model, tokens, valid, multi, generator=gen())
    assert fast.shape == (B, 3, tokens.shape[1], VOCAB)
    used = (multi > 0)[:, :, None] & valid[:, None, :]
    assert_close_on(fast, slow, used)
    assert torch.isfinite(fast).all()

    # the readout really depends on depth (guards against a test that compares constants)
    assert (fast[2, 0] - fast[2, 1]).abs()[valid[2]].max() > 1e-6


@pytest.mark.parametrize("norm, placement", STRUCTURES, ids=["-".join(s) for s in STRUCTURES])
@pytest.mark.parametrize("multi", [False, True], ids=["B", "BJ"])
def test_forward_at_depths_gradients_match_naive(norm, placement, multi):
    index = STRUCTURES.index((norm, placement))
    injection = INJECTIONS[index % len(INJECTIONS)]
    init = INIT_STATES[(index // len(INJECTIONS)) % 3] if injection != "none" else "embed"
    model = make_model(
        seed=100 + index,
        norm=norm,
        placement=placement,
        injection=injection,
        init_state=init,
        noise_std=0.5,
        **_variant(index + 3),
    )
    tokens, valid = make_batch(seed=index)
    depths = (
        torch.tensor([[2, 0, 3], [1, -1, 0], [3, 3, 1], [0, 0, 2], [3, 2, 1]])
        if multi
        else torch.tensor([3, 1, 3, 2, 2])
    )
    weights = torch.randn((*depths.shape, tokens.shape[1], VOCAB), generator=gen(5), dtype=torch.float64)
    mask = valid[:, None, :, None] if multi else valid[:, :, None]
    if multi:
        mask = mask & (depths > 0)[:, :, None, None]

    def grads(fn):
        model.zero_grad(set_to_none=True)
        logits = fn(model, tokens, valid, depths, generator=gen())
        loss = torch.where(mask, logits * weights, torch.zeros_like(logits)).sum()
        loss.backward()
        return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}

    fast = grads(LoopedTransformer.forward_at_depths)
    slow = grads(naive_at_depths)
    assert fast.keys() == slow.keys()
    nonzero = 0
    for name in fast:
        a, b = fast[name], slow[name]
        a = torch.zeros_like(b) if a is None and b is not None else a
        b = torch.zeros_like(a) if b is None and a is not None else b
        if a is None:
            continue
        assert torch.allclose(a, b, atol=1e-8, rtol=1e-6), name
        nonzero += int(a.abs().max() > 0)
    assert nonzero >= 5


def test_forward_at_depths_all_rows_same_depth_and_zero_depth_row():
    model = make_model(coda_layers=1)
    tokens, valid = make_batch()
    depths = torch.full((5,), 2)
    assert_close_on(model.forward_at_depths(tokens, valid, depths), model(tokens, valid, 2), valid)
    # a row whose every slot is unused does not disturb the others
    multi = torch.tensor([[2], [0], [2], [2], [2]])
    out = model.forward_at_depths(tokens, valid, multi)
    ref = model(tokens, valid, 2)
    keep = valid.clone()
    keep[1] = False
    assert_close_on(out[:, 0], ref, keep)


def test_forward_at_depths_noise_depends_on_generator():
    model = make_model(init_state="noise", injection="add")
    tokens, valid = make_batch()
    depths = torch.tensor([1, 1, 2, 2, 1])
    a = model.forward_at_depths(tokens, valid, depths, generator=gen(1))
    b = model.forward_at_depths(tokens, valid, depths, generator=gen(1))
    c = model.forward_at_depths(tokens, valid, depths, generator=gen(2))
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-6


# ----------------------------------------------------------------------------- unroll / forward


@pytest.mark.parametrize("injection", INJECTIONS)
def test_unroll_yields_loops_states_and_forward_is_last(injection):
    model = make_model(injection=injection, coda_layers=1)
    tokens, valid = make_batch()
    for loops in (1, 4):
        states = list(model.unroll(tokens, valid, loops))
        assert len(states) == loops
        assert all(h.shape == (5, 6, 16) for h, _ in states)
        h, ctx = states[-1]
        assert_close_on(model(tokens, valid, loops), model.readout(h, ctx), valid, atol=1e-12)
    # consecutive states differ: the core is actually applied each loop
    hs = [h for h, _ in model.unroll(tokens, valid, 3)]
    assert (hs[1] - hs[0]).abs().max() > 1e-6 and (hs[2] - hs[1]).abs().max() > 1e-6


def test_unroll_steps_follow_the_recurrence():
    """h_t = Core(h_{t-1} + e) for add, Core(W_I[e; h]) for concat, Core(Ā h + B̄ e) for contractive, Core(h)
    for none."""
    tokens, valid = make_batch()
    for injection in INJECTIONS:
        model = make_model(injection=injection, init_state="zeros", prelude_layers=1)
        ctx = model.context(valid)
        e = model.encode(tokens, ctx)
        h = torch.zeros_like(e) if injection != "none" else e
        for got, _ in model.unroll(tokens, valid, 3):
            if injection == "add":
                x = h + e
            elif injection == "concat":
                x = torch.cat([e, h], -1) @ model.inject.weight.T
            elif injection == "contractive":
                inject = model.inject
                decay = torch.exp(-torch.exp(inject.log_step + inject.log_rate))
                x = decay * h + torch.exp(inject.log_step) * (e @ inject.input.weight.T)
            else:
                x = h
            for layer in model.core:
                x = layer(x, ctx)
            h = x
            assert torch.allclose(got, h, atol=1e-12)


def test_init_states():
    tokens, valid = make_batch()
    embed = make_model(init_state="embed")
    zeros = make_model(init_state="zeros")
    noise = make_model(init_state="noise", noise_std=2.0)
    ctx = embed.context(valid)
    e = embed.encode(tokens, ctx)
    assert torch.equal(embed.initial_state(e), e)
    assert torch.equal(zeros.initial_state(e), torch.zeros_like(e))
    n = noise.initial_state(e, gen(0))
    assert n.dtype == e.dtype and n.shape == e.shape
    assert torch.equal(n, noise.initial_state(e, gen(0)))
    assert abs(float(n.std()) - 2.0) < 0.3
    # injection "none" always starts at e
    none = make_model(injection="none", init_state="zeros")
    assert torch.equal(none.initial_state(e), e)


# ----------------------------------------------------------------------------- injection and norms


def test_concat_injection_starts_equal_to_add():
    add = make_model(injection="add", init_state="embed", randomize=False, prelude_layers=1, coda_layers=1)
    concat = make_model(injection="concat", init_state="embed", randomize=False, prelude_layers=1, coda_layers=1)
    eye = torch.eye(16, dtype=torch.float64)
    assert torch.equal(concat.inject.weight, torch.cat([eye, eye], dim=1))
    assert concat.inject.bias is None
    missing, unexpected = concat.load_state_dict(add.state_dict(), strict=False)
    assert missing == ["inject.weight"] and unexpected == []
    tokens, valid = make_batch()
    assert_close_on(add(tokens, valid, 4), concat(tokens, valid, 4), valid, atol=1e-12)
    # once W_I moves away from [I | I], the two differ
    with torch.no_grad():
        concat.inject.weight[:, 16:] *= 0.5
    assert (add(tokens, valid, 4) - concat(tokens, valid, 4)).abs().max() > 1e-6


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_core_out_norm(norm):
    plain = make_model(norm=norm, core_out_norm=False)
    with_norm = make_model(norm=norm, core_out_norm=True)
    names = {n for n, _ in with_norm.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert names and all(n.startswith("core_out_norm.") for n in names)
    missing, _ = with_norm.load_state_dict(plain.state_dict(), strict=False)
    assert set(missing) == names
    tokens, valid = make_batch()
    assert (plain(tokens, valid, 2) - with_norm(tokens, valid, 2)).abs()[valid].max() > 1e-6
    # the state leaving the core is normalised: zero mean (layernorm) / unit RMS with unit scale
    with torch.no_grad():
        for p in with_norm.core_out_norm.parameters():
            p.copy_(torch.ones_like(p) if p.dim() == 1 and p is with_norm.core_out_norm.weight else torch.zeros_like(p))
    h, _ = next(iter(with_norm.unroll(tokens, valid, 1)))
    assert torch.allclose(h.pow(2).mean(-1), torch.ones(5, 6, dtype=torch.float64), atol=1e-3)
    # and core_out_norm with simplenorm has no parameters but still exists
    simple = make_model(norm="simplenorm", core_out_norm=True)
    assert simple.core_out_norm is not None


@pytest.mark.parametrize("placement, count", [("pre", 1), ("post", 1), ("pre_sandwich", 2), ("post_sandwich", 2)])
@pytest.mark.parametrize("norm", NORMS)
def test_norm_counts_per_placement(placement, count, norm):
    model = make_model(placement=placement, norm=norm, randomize=False)
    layer = model.core[0]
    norms = [m for m in layer.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
    assert len(norms) == 2 * count  # attention and MLP sublayers
    params = sum(p.numel() for m in norms for p in m.parameters())
    expected = {"layernorm": 2 * 16, "rmsnorm": 16, "simplenorm": 0}[norm] * 2 * count
    assert params == expected


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_residual_formulas(placement):
    from looplab.model.norms import Residual

    torch.manual_seed(0)
    res = Residual(placement, "layernorm", 8).double()
    randomise(res)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    f = torch.nn.Linear(8, 8).double()
    n_in, n_out = res.norm_in, res.norm_out
    expected = {
        "pre": lambda: x + f(n_in(x)),
        "post": lambda: n_out(x + f(x)),
        "pre_sandwich": lambda: x + n_out(f(n_in(x))),
        "post_sandwich": lambda: n_out(x + f(n_in(x))),
    }[placement]()
    assert torch.allclose(res(x, f), expected, atol=1e-12)


def test_unused_slots_have_zero_logits():
    """forward_at_depths documents: "Entries <= 0 are unused slots (their logits are 0)".

    With non-zero biases (any trained model) the unused slots currently hold the
    readout of an all-zero state, which is not 0.
    """
    model = make_model(coda_layers=1)
    tokens, valid = make_batch()
    out = model.forward_at_depths(tokens, valid, torch.tensor([[2, 0], [1, 1], [0, 0], [1, 2], [2, -1]]))
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.equal(out[4, 1], torch.zeros_like(out[4, 1]))


@torch.no_grad()
def test_contractive_injection_keeps_its_state_decay_below_one_whatever_its_weights():
    """ρ(Ā) = max_i exp(−exp(δ_i + a_i)) < 1 at the start (e⁻¹) and after random weights of growing
    scale; B̄ = exp(δ) B starts as the identity."""
    model = make_model(injection="contractive", randomize=False)
    inject = model.inject
    assert torch.allclose(inject.decay(), torch.full((16,), float(torch.exp(torch.tensor(-1.0))), dtype=torch.float64))
    assert torch.equal(inject.input.weight, torch.eye(16, dtype=torch.float64))
    generator = torch.Generator().manual_seed(3)
    for scale in (1.0, 3.0, 5.0):
        inject.log_rate.copy_(scale * torch.randn(16, generator=generator, dtype=torch.float64))
        inject.log_step.copy_(scale * torch.randn(16, generator=generator, dtype=torch.float64))
        decay = inject.decay()
        assert float(decay.min()) >= 0.0 and float(decay.max()) < 1.0  # entries may underflow to 0
    randomised = make_model(injection="contractive", seed=5)  # the test helper's random weights
    assert float(randomised.inject.decay().max()) < 1.0


def test_contractive_injection_learns_its_decay_and_input_map():
    """The loss reaches a, δ and B: each gets a non-zero gradient through the unroll."""
    model = make_model(injection="contractive", init_state="zeros")
    tokens, valid = make_batch()
    model(tokens, valid, 3)[valid].logsumexp(-1).sum().backward()
    inject = model.inject
    for parameter in (inject.log_rate, inject.log_step, inject.input.weight):
        assert parameter.grad is not None and float(parameter.grad.abs().max()) > 1e-8
