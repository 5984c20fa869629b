"""Nanbeige4.2, read natively: the published layout and config, every decoder against the adapter's own full
recompute in float64 (both placements of the loop norm, head_dim wider than hidden / heads as published),
and the reference's features the published model leaves off, refused naming the field.

(The adapter was held against the reference code, run outside the repository: the closing note of the
change that added it gives the table. Checkpointing each loop: tests/unit/test_ouro_huginn.py.)"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from looplab.errors import LooplabError  # noqa: E402
from looplab.generation import generate  # noqa: E402
from looplab.generation.options import DecodeOptions  # noqa: E402
from looplab.lm.model_dir import open_model_dir  # noqa: E402
from looplab.lm.nanbeige import OFF_FEATURES, NanbeigeConfig, NanbeigeForCausalLM, NanbeigeLoop  # noqa: E402
from looplab.token_exits import GenerationExit  # noqa: E402
from tests.lm_dirs import PUBLISHED, published_config, save_own_family  # noqa: E402
from tests.unit.test_ouro_huginn import NEW, PROMPTS, _alone  # noqa: E402


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    """skip_loop_final_norm → the adapter of a tiny published-layout dir, loaded in float64."""
    root = tmp_path_factory.mktemp("nanbeige")
    return {
        skip: open_model_dir(save_own_family("nanbeige", root / f"skip{skip}", skip_loop_final_norm=skip)).load(
            torch.float64
        )
        for skip in (False, True)
    }


def test_the_published_config_builds_the_published_names_and_size():
    config = NanbeigeConfig.from_dict(json.loads((PUBLISHED / "nanbeige4.2-3b_config.json").read_text()), "nb")
    assert (config.loops, config.head_dim, config.num_key_value_heads, config.rope_theta) == (2, 128, 8, 7e7)
    assert config.hidden_size // config.num_attention_heads == 64  # narrower than the heads it projects to
    with torch.device("meta"):
        model = NanbeigeForCausalLM(config)
    layer = [
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]  # fmt: skip
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    expected |= {f"model.layers.{i}.{key}" for i in range(22) for key in layer}
    assert set(model.state_dict()) == expected
    assert tuple(model.model.layers[0].self_attn.q_proj.weight.shape) == (48 * 128, 3072)
    embeddings = 2 * 166144 * 3072  # untied: the embedding and the head
    assert 3.1e9 < sum(p.numel() for p in model.parameters()) - embeddings < 3.2e9  # the "3B" of its name


def test_a_scaled_down_published_checkpoint_opens_with_every_key(loops, tmp_path):
    path = save_own_family("nanbeige", tmp_path / "nb")
    model_dir = open_model_dir(path)
    assert (model_dir.kind, model_dir.model_type, model_dir.native_loops) == ("native", "nanbeige", 2)
    assert isinstance(model_dir.load(), NanbeigeLoop)


def test_a_stored_rotary_table_is_recomputed_not_read(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_own_family("nanbeige", tmp_path / "nb")
    before = open_model_dir(path).load()(torch.tensor([PROMPTS[0]]))
    weights = load_file(path / "model.safetensors")
    tables = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.zeros(8) for i in range(2)}
    save_file({**weights, **tables}, str(path / "model.safetensors"))
    assert torch.equal(open_model_dir(path).load()(torch.tensor([PROMPTS[0]])), before)


@pytest.mark.parametrize("skip", [False, True])
def test_the_norm_closes_every_loop_or_only_the_last(loops, skip):
    loop = loops[skip]
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        h, e, ctx = loop.start(ids)
        layers = h
        for layer in loop.core:
            layers = loop._layer(layer, layers, ctx)
        stepped = loop.step(h, e, ctx)
        logits = loop.readout(stepped, ctx)
    assert torch.equal(stepped, layers if skip else loop.norm(layers))
    assert torch.equal(logits, loop.lm_head(loop.norm(stepped) if skip else stepped))


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("count", [1, 2, 5])
def test_the_cached_step_decoder_equals_each_prompt_recomputed_alone(loops, skip, count):
    loop = loops[skip]
    batched = generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", count), "per_loop"))
    assert batched.tokens == _alone(loop, count)


@pytest.mark.parametrize(
    "decoder, params",
    [("depth", {}), ("wavefront", {}), ("speculative", {"draft_loops": 1, "draft_tokens": 3})],
)
def test_the_other_decoders_equal_the_fixed_depth(loops, decoder, params):
    loop = loops[False]
    run = generate(
        loop, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 3), decoder=decoder, decoder_params=params)
    )
    assert run.tokens == _alone(loop, 3)


@pytest.mark.parametrize("name, params", [("kl", {"eps": 1e-3}), ("latent-diff", {"eps": 0.05}), ("cosine", {})])
def test_exits_that_read_states_or_logits_run_and_stay_in_their_cap(loops, name, params):
    run = generate(loops[True], PROMPTS, NEW, DecodeOptions(GenerationExit(name, 6, params)))
    assert all(1 <= depth <= 6 for row in run.depths for depth in row)
    assert [len(row) for row in run.tokens] == [NEW] * len(PROMPTS)


def test_the_gate_exit_is_refused_in_one_line(loops):
    with pytest.raises(LooplabError, match="reads a learned exit gate, which this model lacks"):
        generate(loops[False], PROMPTS, NEW, DecodeOptions(GenerationExit("gate", 2, {"threshold": 0.5})))


def test_loop_loss_weights_set_the_native_count_as_the_reference_does():
    raw = published_config("nanbeige", loop_loss_weights=[0.25, 0.25], num_loops=7)
    assert NanbeigeConfig.from_dict(raw, "nb").loops == 3


BAD_CONFIGS = [
    *[
        ({name: value}, f"{name} = {value!r} turns on")
        for name, value in [
            ("emb_neighbor_num", 3),
            ("ngram_vocab_size_ratio", 5.0),
            ("insert_ngram_layer_idx", [1]),
            ("enable_hyper_connection", True),
            ("enable_mhc", True),
            ("enable_depth_attention", True),
            ("enable_double_loop_split", True),
            ("loop_share_kv", True),
            ("qk_layernorm", True),
            ("rope_scaling", {"type": "linear", "factor": 2.0}),
        ]
    ],
    ({"num_loops": 0}, "num_loops must be an integer in 1..4096, got 0"),
    ({"num_loops": 1.5}, "num_loops must be an integer in 1..4096, got 1.5"),
    ({"num_loops": "2"}, "num_loops must be an integer in 1..4096, got '2'"),
    ({"head_dim": None, "hidden_size": 30}, "hidden_size (30) must be a multiple of num_attention_heads (48)"),
    ({"num_key_value_heads": 7}, "num_attention_heads (48) must be a multiple of num_key_value_heads (7)"),
    ({"pretraining_tp": 2}, "pretraining_tp must be one of 1, got 2"),
    ({"loop_loss_weights": "half"}, "loop_loss_weights must be a list of numbers"),
]


@pytest.mark.parametrize("fields, message", BAD_CONFIGS, ids=[str(fields) for fields, _ in BAD_CONFIGS])
def test_a_bad_or_unsupported_config_is_refused_naming_the_field(fields, message):
    with pytest.raises(LooplabError, match="^nb: ") as refused:
        NanbeigeConfig.from_dict(published_config("nanbeige", **fields), "nb")
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_every_off_feature_is_in_the_bad_config_table():
    tested = {name for fields, _ in BAD_CONFIGS for name in fields}
    assert {"emb_neighbor_num", "enable_hyper_connection", "enable_depth_attention", "loop_share_kv"} <= tested
    assert tested >= set(OFF_FEATURES) - {"emb_split_num", "ngram_insert_all_layers"}
