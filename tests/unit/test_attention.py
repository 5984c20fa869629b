"""Attention in the looped transformer: padding, causality, SDPA vs math kernels, positional schemes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from looplab.errors import LooplabError
from looplab.model.attention import MATH_BELOW, AttentionContext, SelfAttention, apply_rope, prefers_math, rope_tables
from tests.unit.model_helpers import TOL, VOCAB, assert_close_on, gen, make_batch, make_model

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


@pytest.mark.parametrize(
    "length, head_dim, device, threads, expected",
    [
        (8, 32, "cpu", 2, True),
        (MATH_BELOW - 1, 32, "cpu", 8, True),
        (MATH_BELOW, 32, "cpu", 2, False),
        (4 * MATH_BELOW, 64, "cpu", 2, False),
        (8, 16, "cpu", 2, False),  # narrow heads, short sequence: SDPA
        (MATH_BELOW // 2, 16, "cpu", 2, True),
        (8, 32, "cpu", 1, False),  # one thread: SDPA at every length
        (8, 32, "cuda", 2, False),
    ],
)
def test_auto_kernel_rule(length, head_dim, device, threads, expected):
    assert prefers_math(length, head_dim, torch.device(device), threads) == expected


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("width", [6, MATH_BELOW + 2], ids=["short", "long"])
def test_auto_chooses_by_shape_and_threads_and_agrees_with_both(width, threads):
    auto = make_model(dtype=torch.float32, attention="auto", causal=True, d_model=64, n_heads=2, max_len=128)
    tokens, valid = make_batch(lengths=(width, width - 3), width=width)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert auto.context(valid).use_math == (width < MATH_BELOW and threads > 1)
    finally:
        torch.set_num_threads(before)
    for kernel in ("sdpa", "math"):
        other = make_model(dtype=torch.float32, attention=kernel, causal=True, d_model=64, n_heads=2, max_len=128)
        other.load_state_dict(auto.state_dict())
        assert_close_on(auto(tokens, valid, 3), other(tokens, valid, 3), valid, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_math_records_probabilities(causal):
    torch.manual_seed(0)
    attn = SelfAttention(16, 2).double()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    valid = make_batch(lengths=(6, 2, 4))[1]
    ctx = AttentionContext.build(valid, causal, None, use_math=True)
    recorded = []
    attn.weights.register_forward_hook(lambda _module, args, out: recorded.append(out))
    out = attn(x, ctx)
    assert len(recorded) == 1
    probs = recorded[0]
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
    ctx = replace(model.context(valid), use_math=True)
    e = model.encode(tokens, ctx)
    recorded = []
    for layer in model.core:
        layer.attn.weights.register_forward_hook(lambda _module, args, out: recorded.append(out))
    model.step(e, e, ctx)
    assert len(recorded) == 2
    assert all(p.shape == (5, 2, 6, 6) for p in recorded)


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
    g = gen(0)
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


# ----------------------------------------------------------------------------- local attention windows


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("window", [1, 2])
def test_attention_window_masks_far_keys(causal, padded, window):
    torch.manual_seed(0)
    attn = SelfAttention(16, 2).double()
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    valid = make_batch(lengths=(7, 3, 5) if padded else (7,) * 3)[1]
    ctx = AttentionContext.build(valid, causal, None, use_math=True, window=window)
    recorded = []
    attn.weights.register_forward_hook(lambda _module, args, out: recorded.append(out))
    out = attn(x, ctx)
    probs = recorded[0]
    offset = torch.arange(7)[:, None] - torch.arange(7)[None, :]
    allowed = (offset.abs() <= window) & ((offset >= 0) if causal else True)
    queries = valid[:, None, :, None].expand_as(probs)  # padding queries' outputs are never read
    keys = valid[:, None, None, :].expand_as(probs)
    assert torch.isfinite(probs).all()
    assert (probs[queries & ~allowed.expand_as(probs)] == 0).all()
    assert (probs[queries & ~keys] == 0).all()
    assert (probs[queries & keys & allowed.expand_as(probs)] > 0).all()
    fast = attn(x, AttentionContext.build(valid, causal, None, use_math=False, window=window))
    assert torch.allclose(fast[valid], out[valid], atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_attention_window_bounds_how_far_information_moves(causal):
    """With window w and k core layers, t loops carry a token's influence at most w·k·t positions."""
    model = make_model(core_layers=2, attention_window=1, causal=causal, positional="nope")
    tokens, valid = make_batch(lengths=(12,) * 2)
    changed = tokens.clone()
    changed[:, 0] = (tokens[:, 0] % (VOCAB - 1)) + 1  # a different token at position 0
    for loops in (1, 2):
        reach = 1 * 2 * loops
        moved = (model(tokens, valid, loops) - model(changed, valid, loops)).abs().amax(-1)  # [B, L]
        assert (moved[:, reach + 1 :] == 0).all(), loops
        assert (moved[:, reach] > 0).all(), loops


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_attention_window_per_row_depths_match_naive(causal):
    from tests.unit.test_model import naive_at_depths

    model = make_model(attention_window=2, causal=causal)
    tokens, valid = make_batch()
    depths = torch.tensor([3, 1, 4, 2, 3])
    fast = model.forward_at_depths(tokens, valid, depths, generator=gen())
    assert_close_on(fast, naive_at_depths(model, tokens, valid, depths, generator=gen()), valid)


def test_attention_window_must_not_be_negative():
    from looplab.config import load_config

    with pytest.raises(LooplabError, match=r"model\.attention_window must be in \[0, inf\)"):
        load_config(None, ["model.attention_window=-1"])
