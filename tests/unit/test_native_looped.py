"""transformers' native looped LMs (HRM-Text, Inkling-2 loop) wrapped into the looped-model protocol:
tiny random models saved and loaded back, logits equal to transformers' at every loop count (no network)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    HrmTextConfig,
    HrmTextForCausalLM,
    Inkling2LoopConfig,
    Inkling2LoopForCausalLM,
    Inkling2LoopForConditionalGeneration,
    Inkling2LoopTextConfig,
    LlamaConfig,
    LlamaForCausalLM,
)

from looplab.errors import LooplabError  # noqa: E402
from looplab.lm.families import LOOPED_FAMILIES, native_loop  # noqa: E402
from looplab.lm.hrm_text import HrmTextLoop  # noqa: E402
from looplab.lm.inkling2_loop import Inkling2Loop  # noqa: E402
from looplab.model.protocol import readouts_by_loops  # noqa: E402
from looplab.model.trace import trace  # noqa: E402

VOCAB, D, ATOL = 61, 32, 1e-5
NATIVE = {"hrm_text": 3, "inkling2_loop": 3}
LOOP_KEY = {"hrm_text": "H_cycles", "inkling2_loop": "loop_num_passes"}

HRM = dict(
    vocab_size=VOCAB,
    hidden_size=D,
    intermediate_size=64,
    num_hidden_layers=2,  # per stack
    num_attention_heads=4,
    head_dim=8,
    H_cycles=NATIVE["hrm_text"],
    L_cycles=2,
    max_position_embeddings=64,
)
# 8 layers in blocks of 2; layers 2..5 looped; sliding window, relative-bias extent and the log-scaling
# floor all shorter than the batch's 9 tokens, so every position-dependent path runs
INKLING = dict(
    vocab_size=64,
    unpadded_vocab_size=VOCAB,
    hidden_size=D,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=8,
    sliding_window_size=4,
    d_rel=4,
    rel_extent=6,
    log_scaling_n_floor=4,
    n_layers_per_attn_res_block=2,
    moe_intermediate_size=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    loop_layer_index_start=2,
    loop_layer_index_end=6,
    loop_num_passes=NATIVE["inkling2_loop"],
    loop_gate_rank=8,
    max_position_embeddings=64,
    eos_token_id=None,
    layer_types=["hybrid" if (i + 1) % 3 == 0 else "hybrid_sliding" for i in range(8)],
)


def _randomise(model: torch.nn.Module, std: float) -> torch.nn.Module:
    """Every parameter random: initialisation leaves some at zero (block queries, z_L_init, conv taps),
    which would hide the paths they gate. The scale keeps the recurrence tame: at std 0.3 a tiny
    Inkling-2 at 6 passes turns float rounding into 1e-4 logit differences between one row run alone
    and the same row in a batch, in transformers' own forward."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, std)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family → directory of a tiny random model, written with save_pretrained."""
    torch.manual_seed(0)
    models = {
        "hrm_text": _randomise(HrmTextForCausalLM(HrmTextConfig(**HRM)), 0.1),
        "inkling2_loop": _randomise(Inkling2LoopForCausalLM(Inkling2LoopTextConfig(**INKLING)), 0.2),
    }
    paths = {}
    for family, model in models.items():
        paths[family] = tmp_path_factory.mktemp(family)
        model.save_pretrained(paths[family])
    return paths


def _load(path, **config):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **config).eval()


@pytest.fixture(scope="module")
def batch():
    """A padded batch of mixed lengths (9, 6, 3), right padding."""
    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


def _transformers_logits(path, family, loops, ids, mask):
    model = _load(path, **{LOOP_KEY[family]: loops})
    assert getattr(model.config, LOOP_KEY[family]) == loops
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


FAMILIES = sorted(NATIVE)


@pytest.mark.parametrize("family", FAMILIES)
def test_native_loop_count_gives_transformers_logits(saved, batch, family):
    ids, mask = batch
    valid = mask.bool()
    model = _load(saved[family])
    loop = native_loop(model).eval()
    assert loop.native_loops == NATIVE[family]
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        logits = loop(ids, mask)
    assert (logits[valid] - reference[valid]).abs().max() <= ATOL


@pytest.mark.parametrize("loops", [1, 2, 6])
@pytest.mark.parametrize("family", FAMILIES)
def test_other_loop_counts_give_transformers_logits_at_that_count(saved, batch, family, loops):
    ids, mask = batch
    valid = mask.bool()
    loop = native_loop(_load(saved[family])).eval()
    reference = _transformers_logits(saved[family], family, loops, ids, mask)
    native = _transformers_logits(saved[family], family, NATIVE[family], ids, mask)
    with torch.no_grad():
        logits = loop(ids, mask, loops=loops)
    assert (logits[valid] - reference[valid]).abs().max() <= ATOL
    assert (reference[valid] - native[valid]).abs().max() > 1e-3  # the loop count matters


@pytest.mark.parametrize("family", FAMILIES)
def test_one_unroll_reads_every_depth_as_separate_unrolls(saved, batch, family):
    ids, mask = batch
    valid = mask.bool()
    loop = native_loop(_load(saved[family])).eval()
    t_max = 2 * NATIVE[family]
    with torch.no_grad():
        separate = [loop(ids, mask, loops=t) for t in range(1, t_max + 1)]
        for t, (_, logits) in enumerate(readouts_by_loops(loop, ids, valid, t_max, at=valid), start=1):
            assert (logits - separate[t - 1][valid]).abs().max() <= ATOL
        depths = torch.tensor([2, t_max, 1])  # out of order: the rows are sorted and compacted
        at_depths = loop.forward_at_depths(ids, valid, depths)
        slots = loop.forward_at_depths(ids, valid, torch.tensor([[1, 3], [2, 0], [t_max, 1]]))
    for row, depth in enumerate(depths.tolist()):
        assert (at_depths[row][valid[row]] - separate[depth - 1][row][valid[row]]).abs().max() <= ATOL
    for row, wanted in enumerate([[1, 3], [2, 0], [t_max, 1]]):
        for slot, depth in enumerate(wanted):
            expected = separate[depth - 1][row] if depth > 0 else torch.zeros_like(separate[0][row])
            assert (slots[row, slot][valid[row]] - expected[valid[row]]).abs().max() <= ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_the_adapter_shares_the_models_weights(saved, family):
    model = _load(saved[family])
    model_tensors = {p.data_ptr() for p in model.parameters()}
    assert {p.data_ptr() for p in native_loop(model).parameters()} <= model_tensors
    copied = native_loop(model, copy_weights=True)
    assert not {p.data_ptr() for p in copied.parameters()} & model_tensors


@pytest.mark.parametrize("family", FAMILIES)
def test_trace_records_every_loop_and_the_unrolls_last_state(saved, batch, family):
    ids, mask = batch
    loop = native_loop(_load(saved[family])).eval()
    recorded = trace(loop, ids, mask.bool(), 2, attention=True)
    n_core = len(loop.core)
    for t in (1, 2):
        for layer in range(n_core):
            assert recorded[f"loop0{t}.core{layer}.attn"].shape == (3, 4, 9, 9)
    with torch.no_grad():
        *_, last = loop.unroll(ids, mask, 2)
    assert torch.allclose(recorded["loop02.state"], last, atol=ATOL)
    assert [len(loop.prelude), len(loop.coda)] == ([0, 0] if family == "hrm_text" else [2, 2])


@pytest.mark.parametrize("passes", [1, 2])
def test_hrm_gradients_follow_transformers_bp_rule_with_l_grad_passes(saved, batch, passes):
    """With H_cycles = 2 and L_bp_cycles = [passes] transformers keeps gradient through the last
    ``passes`` L passes of both H cycles — the one rule the adapter applies to every loop."""
    ids, mask = batch
    reference = _load(saved["hrm_text"], H_cycles=2, L_bp_cycles=[passes, passes])
    reference(input_ids=ids, attention_mask=mask, use_cache=False).logits.square().mean().backward()
    model = _load(saved["hrm_text"])
    loop = HrmTextLoop(model, l_grad_passes=passes)
    loop(ids, mask, loops=2).square().mean().backward()
    expected = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert torch.allclose(parameter.grad, expected[name].grad, atol=1e-6), name
    if passes < HRM["L_cycles"]:  # fewer tracked passes than the default (all of them) changes the gradient
        full = HrmTextLoop(_load(saved["hrm_text"]))
        full(ids, mask, loops=2).square().mean().backward()
        tracked = model.model.L_module.layers[0].mlp.up_proj.weight.grad
        assert not torch.allclose(full.core[0].mlp.up_proj.weight.grad, tracked)


def test_inkling_gradients_are_transformers(saved, batch):
    ids, mask = batch
    reference = _load(saved["inkling2_loop"], loop_num_passes=2)
    reference(input_ids=ids, attention_mask=mask, use_cache=False).logits.square().mean().backward()
    model = _load(saved["inkling2_loop"])
    Inkling2Loop(model)(ids, mask, loops=2).square().mean().backward()
    expected = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        if expected[name].grad is None:
            assert parameter.grad is None, name
        else:
            assert torch.allclose(parameter.grad, expected[name].grad, atol=1e-6), name


def test_the_multimodal_inkling_model_is_wrapped_on_its_text_path(batch):
    ids, mask = batch
    torch.manual_seed(2)
    config = Inkling2LoopConfig(
        text_config=INKLING,
        vision_config={
            "model_type": "inkling2_vision",
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "patch_size": 4,
            "posemb_grid_size": 4,
            "projection_hidden_dim": 16,
            "text_hidden_size": D,
        },
        image_token_id=VOCAB - 1,
    )
    model = _randomise(Inkling2LoopForConditionalGeneration(config), 0.2).eval()
    loop = native_loop(model)
    assert isinstance(loop, Inkling2Loop) and loop.native_loops == NATIVE["inkling2_loop"]
    valid = mask.bool()
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        assert (loop(ids, mask)[valid] - reference[valid]).abs().max() <= ATOL


def test_the_registry_refuses_other_models_in_one_line(saved):
    assert set(LOOPED_FAMILIES) == {
        "hrm_text", "inkling2_loop", "inkling2_loop_text", "ouro", "huginn_raven", "nanbeige", "parcae"
    }  # fmt: skip
    llama = LlamaForCausalLM(
        LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=VOCAB)
    )
    with pytest.raises(
        LooplabError,
        match="'llama'; supported: hrm_text, huginn_raven, inkling2_loop, inkling2_loop_text, nanbeige, ouro, parcae$",
    ) as err:
        native_loop(llama)
    assert "\n" not in str(err.value)
    with pytest.raises(LooplabError, match="wraps model_type 'hrm_text'"):
        HrmTextLoop.from_pretrained_model(_load(saved["inkling2_loop"]))
    with pytest.raises(LooplabError, match="l_grad_passes must lie in 0..2"):
        HrmTextLoop(_load(saved["hrm_text"]), l_grad_passes=3)
    with pytest.raises(LooplabError, match="loops must be ≥ 1"):
        native_loop(_load(saved["hrm_text"]))(torch.zeros(1, 2, dtype=torch.long), loops=0)
