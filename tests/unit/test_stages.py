"""Stage alignment and amplitude, sink mass, named MLP zeroing, MLP output maxima, attention reuse."""

from __future__ import annotations

import math

import pytest
import torch

from looplab.analysis.attention_reuse import AttentionReuse, pattern_change
from looplab.analysis.massive import mlp_modules, mlp_output_max, zero_mlp
from looplab.analysis.stages import (
    block_means,
    distance_to_state,
    sink_mass,
    stage_alignment,
    stage_amplitude,
    top_activation,
)
from looplab.errors import LooplabError
from tests.unit.test_analysis_metrics import inputs, tiny_model


def test_block_means_and_its_refusal():
    assert block_means(torch.arange(8.0), 4).tolist() == [0.5, 2.5, 4.5, 6.5]
    with pytest.raises(ValueError, match="equal blocks"):
        block_means(torch.arange(6.0), 4)


def test_alignment_is_the_correlation_with_the_resampled_reference():
    reference = torch.tensor([0.1, 0.1, 0.5, 0.5, 0.9, 0.9, 0.2, 0.2])  # block means 0.1, 0.5, 0.9, 0.2
    curves = torch.tensor([[0.1, 0.5, 0.9, 0.2], [0.2, 0.9, 0.5, 0.1], [0.3, 0.3, 0.3, 0.3]])
    aligned = stage_alignment(curves, reference)
    assert aligned[0] == pytest.approx(1.0)
    expected = torch.corrcoef(torch.stack([curves[1], torch.tensor([0.1, 0.5, 0.9, 0.2])]))[0, 1]
    assert aligned[1] == pytest.approx(float(expected))
    assert math.isnan(aligned[2])  # a flat curve has no stages: undefined, not 0
    assert stage_amplitude(curves).tolist() == pytest.approx([0.8, 0.8, 0.0])


def test_sink_mass_counts_valid_queries_only():
    probs = torch.zeros(1, 1, 3, 3)
    probs[0, 0, :, 0] = torch.tensor([1.0, 0.5, 0.0])
    probs[0, 0, 1, 1], probs[0, 0, 2, 2] = 0.5, 1.0
    assert sink_mass(probs)[0, 0] == pytest.approx(0.5)
    valid = torch.tensor([[True, True, False]])
    assert sink_mass(probs, valid)[0, 0] == pytest.approx(0.75)


def test_top_activation_and_distance_ignore_padding():
    states = torch.tensor([[[1.0, -2.0], [50.0, 0.0]]])  # [B=1, T=2, d=2]
    valid = torch.tensor([[True, False]])
    assert float(top_activation(states, valid)) == 2.0
    assert float(top_activation(states)) == 50.0
    target = torch.tensor([[[1.0, -1.0], [0.0, 0.0]]])
    assert float(distance_to_state(states, target, valid)) == pytest.approx(1 / math.sqrt(2))
    # per layer: each state against its own layer's target, divided by that target's norm
    layered = torch.stack([target, 10 * target])  # [layers=2, B, T, d]
    assert distance_to_state(torch.zeros(3, 2, 1, 2, 2), layered, valid).tolist() == [[1.0, 1.0]] * 3


def test_mlps_are_named_by_site_and_zeroed_by_name():
    model = tiny_model(positional="learned", prelude_layers=1, coda_layers=1)
    assert list(mlp_modules(model)) == ["prelude0", "core0", "core1", "coda0"]
    tokens, valid = inputs()
    with torch.no_grad():
        before = model(tokens, valid, 2)
        with zero_mlp(model, "prelude0"):
            ablated = model(tokens, valid, 2)
        largest = mlp_output_max(model, lambda: model(tokens, valid, 2), valid)
    assert not torch.allclose(before, ablated)
    assert not model.prelude[0].mlp._forward_hooks
    assert set(largest) == set(mlp_modules(model)) and min(largest.values()) > 0
    with pytest.raises(LooplabError, match="unknown MLP to zero 'core7'; valid choices: coda0, core0, core1"):
        with zero_mlp(model, "core7"):
            pass


def unroll(model, tokens, valid, loops):
    h, e, ctx = model.start(tokens, valid)
    for _ in range(loops):
        h = model.step(h, e, ctx)
    return model.readout(h, ctx)


@torch.no_grad()
def test_attention_reuse_with_no_threshold_changes_nothing_and_hooks_go():
    model = tiny_model(positional="learned")
    tokens, valid = inputs()
    exact = unroll(model, tokens, valid, 4)
    with AttentionReuse(model, valid, 0.0) as reuse:
        same = unroll(model, tokens, valid, 4)
    assert torch.allclose(exact, same, atol=1e-12)  # math kernel vs SDPA: rounding only
    assert reuse.reused_share == 0.0
    assert not any(layer.attn.weights._forward_hooks for layer in model.core)


@torch.no_grad()
def test_attention_reuse_freezes_patterns_after_they_settle():
    model = tiny_model(positional="learned")
    tokens, valid = inputs()
    with AttentionReuse(model, valid, 2.0) as reuse:  # every change is below 2: all freeze after loop 2
        frozen = unroll(model, tokens, valid, 4)
    # loops 1 and 2 compute every pattern, loops 3 and 4 reuse them all
    assert reuse.reused_share == pytest.approx(0.5)
    assert not torch.allclose(frozen, unroll(model, tokens, valid, 4))

    # the reused pattern is loop 2's: recompute loop 3 with loop 2's probabilities held fixed
    seen = {}

    def keep(index):
        def hook(_module, _args, probs):
            seen.setdefault(index, []).append(probs)
            return seen[index][1] if len(seen[index]) > 2 else probs

        return hook

    handles = [layer.attn.weights.register_forward_hook(keep(i)) for i, layer in enumerate(model.core)]
    try:
        manual = unroll(model, tokens, valid, 4)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.allclose(frozen, manual, atol=1e-12)


def test_pattern_change_is_total_variation_over_valid_queries():
    old = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])
    new = torch.tensor([[[[0.0, 1.0], [0.5, 0.5]]]])
    assert float(pattern_change(new, old)) == pytest.approx(0.5)
    assert float(pattern_change(new, old, torch.tensor([[True, False]]))) == pytest.approx(1.0)
