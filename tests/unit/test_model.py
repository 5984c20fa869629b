"""The looped transformer: per-row depths vs the naive unroll, padding, causality, kernels, RoPE."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from looplab.config import INIT_STATES, INJECTIONS, NORMS, PLACEMENTS, ModelConfig
from looplab.errors import LooplabError
from looplab.model import LoopedTransformer
from looplab.model.attention import AttentionContext, SelfAttention, apply_rope, rope_tables

VOCAB = 7
TOL = 1e-5


def _randomize(model: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Give every parameter (norm scales, biases, the head bias too) a generic non-trivial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if p.dim() >= 2:
                p.copy_(scale * noise)
            elif name.endswith("weight"):  # a norm's scale
                p.copy_(1.0 + 0.1 * noise)
            else:  # a bias
                p.copy_(0.1 * noise)


def make_model(seed: int = 0, dtype=torch.float64, randomize: bool = True, **overrides) -> LoopedTransformer:
    base = dict(d_model=16, n_heads=2, mlp_ratio=2, core_layers=1, max_len=32)
    cfg = ModelConfig(**{**base, **overrides})
    torch.manual_seed(seed)
    model = LoopedTransformer(cfg, VOCAB).to(dtype)
    if randomize:
        _randomize(model, seed)
    return model


def make_batch(lengths=(6, 3, 5, 1, 4), width: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    tokens = torch.randint(1, VOCAB, (len(lengths), width), generator=g)
    valid = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    return tokens, valid


def _gen(seed: int = 123) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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


def assert_close_on(a, b, mask, atol=TOL):
    """Compare [..., L, V] tensors on positions where mask [..., L] is True."""
    diff = (a - b).abs().amax(-1)[mask]
    assert diff.numel() > 0
    worst = float(diff.detach().max())
    assert worst <= atol, worst


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
    fast = model.forward_at_depths(tokens, valid, depths, generator=_gen())
    slow = naive_at_depths(model, tokens, valid, depths, generator=_gen())
    assert fast.shape == (B, tokens.shape[1], VOCAB)
    assert_close_on(fast, slow, answer)

    # [B, J] with unused slots (<= 0), a row with a single used slot, repeated depths
    multi = torch.tensor([[2, 0, 4], [1, -1, 0], [4, 3, 4], [0, 0, 2], [3, 2, 1]])
    fast = model.forward_at_depths(tokens, valid, multi, generator=_gen())
    slow = naive_at_depths(model, tokens, valid, multi, generator=_gen())
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
    injection = INJECTIONS[index % 3]
    init = INIT_STATES[(index // 3) % 3] if injection != "none" else "embed"
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
    weights = torch.randn((*depths.shape, tokens.shape[1], VOCAB), generator=_gen(5), dtype=torch.float64)
    mask = valid[:, None, :, None] if multi else valid[:, :, None]
    if multi:
        mask = mask & (depths > 0)[:, :, None, None]

    def grads(fn):
        model.zero_grad(set_to_none=True)
        logits = fn(model, tokens, valid, depths, generator=_gen())
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
    a = model.forward_at_depths(tokens, valid, depths, generator=_gen(1))
    b = model.forward_at_depths(tokens, valid, depths, generator=_gen(1))
    c = model.forward_at_depths(tokens, valid, depths, generator=_gen(2))
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
    """h_t = Core(h_{t-1} + e) for add, Core(W_I[e; h]) for concat, Core(h) for none."""
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
    n = noise.initial_state(e, _gen(0))
    assert n.dtype == e.dtype and n.shape == e.shape
    assert torch.equal(n, noise.initial_state(e, _gen(0)))
    assert abs(float(n.std()) - 2.0) < 0.3
    # injection "none" always starts at e
    none = make_model(injection="none", init_state="zeros")
    assert torch.equal(none.initial_state(e), e)


# ----------------------------------------------------------------------------- padding and causality


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_padding_invariance(causal, positional):
    model = make_model(
        causal=causal, positional=positional, prelude_layers=1, coda_layers=1, placement="post_sandwich", norm="rmsnorm"
    )
    tokens, valid = make_batch(lengths=(4, 2, 3))
    alone = model(tokens, valid, 3)  # padded to 4
    wider_tokens, wider_valid = make_batch(lengths=(4, 2, 3), width=9)
    wider_tokens[:, :4] = tokens  # same rows, more padding
    wider_tokens[:, 4:] = 0
    extra_tokens, extra_valid = make_batch(lengths=(9,), seed=7)
    big_tokens = torch.cat([wider_tokens, extra_tokens])  # plus a longer row
    big_valid = torch.cat([wider_valid, extra_valid])
    big = model(big_tokens, big_valid, 3)[:3, :4]
    assert_close_on(alone, big, valid, atol=1e-10)
    # each row alone, without any padding, agrees as well
    for i, n in enumerate((4, 2, 3)):
        single = model(tokens[i : i + 1, :n], valid[i : i + 1, :n], 3)
        assert torch.allclose(single[0], alone[i, :n], atol=1e-10)
    # and forward_at_depths too
    fad = model.forward_at_depths(big_tokens, big_valid, torch.tensor([3, 3, 3, 1]))[:3, :4]
    assert_close_on(alone, fad, valid, atol=1e-10)


def test_padding_tokens_do_not_leak():
    """Whatever sits at padded positions is never attended to."""
    model = make_model(prelude_layers=1, coda_layers=1)
    tokens, valid = make_batch()
    other = torch.where(valid, tokens, torch.full_like(tokens, 5))
    assert_close_on(model(tokens, valid, 3), model(other, valid, 3), valid, atol=1e-12)


def test_causal_attention_hides_the_future():
    tokens, valid = make_batch(lengths=(6, 6))
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] % (VOCAB - 1)) + 1
    assert not torch.equal(changed, tokens)
    causal = make_model(causal=True, prelude_layers=1, coda_layers=1)
    a, b = causal(tokens, valid, 3), causal(changed, valid, 3)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-12)
    assert (a[:, 4:] - b[:, 4:]).abs().max() > 1e-6
    # bidirectional: the change reaches earlier positions
    bidir = make_model(causal=False, prelude_layers=1, coda_layers=1)
    a, b = bidir(tokens, valid, 3), bidir(changed, valid, 3)
    assert (a[:, :4] - b[:, :4]).abs().max() > 1e-6


def test_causal_with_padding_hides_the_future():
    tokens, valid = make_batch(lengths=(6, 5, 3))
    changed = tokens.clone()
    changed[:, 2] = (changed[:, 2] % (VOCAB - 1)) + 1
    model = make_model(causal=True)
    a, b = model(tokens, valid, 2), model(changed, valid, 2)
    assert torch.allclose(a[:, :2], b[:, :2], atol=1e-12)


# ----------------------------------------------------------------------------- attention kernels


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("rope", [False, True], ids=["nope", "rope"])
def test_sdpa_and_math_agree(causal, padded, rope):
    torch.manual_seed(0)
    attn = SelfAttention(16, 2)
    x = torch.randn(4, 7, 16)
    valid = make_batch(lengths=(7, 3, 5, 1) if padded else (7,) * 4)[1]
    tables = rope_tables(7, 8, 10000.0, "cpu", torch.float32) if rope else None
    fast = attn(x, AttentionContext.build(valid, causal, tables, use_math=False))
    slow = attn(x, AttentionContext.build(valid, causal, tables, use_math=True))
    assert torch.allclose(fast[valid], slow[valid], atol=TOL)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_model_sdpa_and_math_agree(causal):
    sdpa = make_model(dtype=torch.float32, attention="sdpa", causal=causal, prelude_layers=1, coda_layers=1)
    math_model = make_model(dtype=torch.float32, attention="math", causal=causal, prelude_layers=1, coda_layers=1)
    math_model.load_state_dict(sdpa.state_dict())
    tokens, valid = make_batch()
    assert_close_on(sdpa(tokens, valid, 3), math_model(tokens, valid, 3), valid, atol=1e-4)
    full_tokens, full_valid = make_batch(lengths=(6, 6))
    assert_close_on(sdpa(full_tokens, full_valid, 3), math_model(full_tokens, full_valid, 3), full_valid, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_math_records_probabilities(causal):
    torch.manual_seed(0)
    attn = SelfAttention(16, 2).double()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    valid = make_batch(lengths=(6, 2, 4))[1]
    ctx = AttentionContext.build(valid, causal, None, use_math=False)
    ctx.probs = []
    out = attn(x, ctx)
    assert len(ctx.probs) == 1
    probs = ctx.probs[0]
    assert probs.shape == (3, 2, 6, 6)
    assert torch.allclose(probs.sum(-1), torch.ones(3, 2, 6, dtype=torch.float64), atol=1e-12)
    assert (probs >= 0).all()
    padded_keys = ~valid[:, None, None, :].expand_as(probs)
    assert (probs[padded_keys] == 0).all()
    if causal:
        future = torch.ones(6, 6, dtype=torch.bool).triu(1).expand_as(probs)
        assert (probs[future] == 0).all()
    else:
        # bidirectional: the first query of the full row sees its last key
        assert (probs[0, :, 0, 5] > 0).all()
    # the recorded probabilities are the ones used: recompute the output from them
    q, k, v = attn.qkv(x).view(3, 6, 3, 2, -1).permute(2, 0, 3, 1, 4)
    y = (probs @ v).transpose(1, 2).reshape(3, 6, 16)
    assert torch.allclose(attn.out(y), out, atol=1e-12)
    # and agree with SDPA on valid rows
    plain = attn(x, AttentionContext.build(valid, causal, None, use_math=False))
    assert torch.allclose(plain[valid], out[valid], atol=1e-10)


def test_model_step_records_one_probability_tensor_per_core_layer():
    model = make_model(core_layers=2)
    tokens, valid = make_batch()
    ctx = model.context(valid)
    ctx.probs = []
    e = model.encode(tokens, ctx)
    ctx.probs.clear()
    model.step(e, e, ctx)
    assert len(ctx.probs) == 2
    assert all(p.shape == (5, 2, 6, 6) for p in ctx.probs)


# ----------------------------------------------------------------------------- positional schemes


@pytest.mark.parametrize("positional", ["rope", "nope", "learned"])
def test_positional_schemes_run(positional):
    model = make_model(positional=positional)
    tokens, valid = make_batch()
    logits = model(tokens, valid, 2)
    assert logits.shape == (5, 6, VOCAB)
    assert torch.isfinite(logits).all()
    assert (model.positions is not None) == (positional == "learned")


@pytest.mark.parametrize("positional, equivariant", [("nope", True), ("rope", False), ("learned", False)])
def test_only_nope_is_permutation_equivariant(positional, equivariant):
    model = make_model(positional=positional)
    tokens, valid = make_batch(lengths=(6, 6))
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    a = model(tokens, valid, 2)[:, perm]
    b = model(tokens[:, perm], valid, 2)
    assert torch.allclose(a, b, atol=1e-10) == equivariant


def test_learned_positions_reject_too_long_sequences():
    model = make_model(positional="learned", max_len=6)
    tokens, valid = make_batch(lengths=(6, 3))
    assert model(tokens, valid, 1).shape == (2, 6, VOCAB)  # exactly max_len is fine
    long_tokens, long_valid = make_batch(lengths=(7, 3))
    with pytest.raises(LooplabError, match="max_len"):
        model(long_tokens, long_valid, 1)
    with pytest.raises(LooplabError, match="max_len"):
        model.forward_at_depths(long_tokens, long_valid, torch.tensor([1, 2]))


def test_rope_relative_position_property():
    head_dim, length = 8, 12
    cos, sin = rope_tables(length, head_dim, 10000.0, "cpu", torch.float64)
    assert cos.shape == sin.shape == (length, head_dim)
    g = _gen(0)
    q = torch.randn(head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(head_dim, generator=g, dtype=torch.float64)
    rq = apply_rope(q.expand(1, 1, length, head_dim), cos, sin)[0, 0]  # q placed at every position
    rk = apply_rope(k.expand(1, 1, length, head_dim), cos, sin)[0, 0]
    scores = rq @ rk.T  # [m, n] = <R_m q, R_n k>
    for m in range(length - 1):
        for n in range(length - 1):
            assert abs(float(scores[m + 1, n + 1] - scores[m, n])) < 1e-5
    # it is not position-independent altogether
    assert abs(float(scores[0, 0] - scores[0, 5])) > 1e-3
    # position 0 is the identity, and rotation preserves norms
    assert torch.allclose(rq[0], q, atol=1e-12)
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(length), atol=1e-6)


def test_rope_rotates_channel_pairs_by_expected_angle():
    head_dim = 4
    cos, sin = rope_tables(3, head_dim, 100.0, "cpu", torch.float64)
    # channel i pairs with channel i + head_dim/2 ("rotate half")
    x = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64).expand(1, 1, 3, head_dim)
    out = apply_rope(x, cos, sin)[0, 0]
    for pos in range(3):
        for i, freq in enumerate([1.0, 100.0**-0.5]):
            angle = pos * freq
            assert out[pos, i] == pytest.approx(math.cos(angle), abs=1e-6)
            assert out[pos, i + head_dim // 2] == pytest.approx(math.sin(angle), abs=1e-6)


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
    _randomize(res)
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
