"""Parcae, read natively: the published layout and sizes, a checkpoint saved as the reference saves it, every
decoder and cache policy against the adapter's own full recompute in float64, padding, the state start, the
injection's decay, and the configs it refuses.

(The adapter was held against the reference code, run outside the repository, in float32: max |Δ logits| at
1, 8 and 16 loops ≤ 7.3e-6, and the cached decoder's greedy tokens of a padded batch equal to each prompt
decoded alone by the reference; the closing note of the change that added it gives the table.)"""

from __future__ import annotations

import json

import pytest
import torch

from looplab.errors import LooplabError
from looplab.generation import generate
from looplab.generation.options import DecodeOptions
from looplab.lm.families import LOOPED_FAMILIES
from looplab.lm.parcae import FAMILY, ParcaeConfig, ParcaeDecoding, ParcaeForCausalLM, ParcaeLoop
from looplab.token_exits import GenerationExit
from tests.lm_dirs import PUBLISHED

PROMPTS = [[3, 5, 7, 9, 11, 2, 4], [6, 8], [10, 12, 14, 1]]
NEW = 5
#: the published 140M config at a tiny size: (2, 2, 2) blocks, value embeddings at prelude 1, core 1, coda 1
TINY = dict(n_embd=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, vocab_size=61,
            padded_vocab_size=64, block_size=128, recurrent_embedding_dimension=32,
            recurrent_intermediation_embedding_dimension=48)  # fmt: skip
#: everything else the reference offers: grouped keys and values in the prelude and coda (4 heads, 2 kv) but not
#: in the core, (2, 1, 2) blocks whose tables and gates meet at coda 1 alone, the linear injection, LayerNorm, a
#: gated SiLU MLP, biases, clipping, a soft cap, takase-scaled's embedding and logit scales, an untied head
MIXED = dict(TINY, num_key_value_heads=2, n_layers_in_recurrent_block=1, injection_type="linear",
             norm_class_name="LayerNorm", mlp_class_name="GatedMLP", nonlin_name="SiLU", bias=True, qk_norm=False,
             clip_qkv=1.5, logit_softcap=4.0, init_strategy="takase-scaled", tie_embeddings=False,
             prelude_norm=False)  # fmt: skip


def published(name: str = "parcae-140m") -> dict:
    return json.loads((PUBLISHED / f"{name}_config.json").read_text())


def build(sizes: dict, seed: int = 0) -> ParcaeForCausalLM:
    """A random float64 model of the published config with ``sizes`` over it (every weight off its start, so the
    norms, the injection's A_log, dt_bias and B and the value-embedding gates all show)."""
    torch.manual_seed(seed)
    model = ParcaeForCausalLM(ParcaeConfig.from_dict({**published(), **sizes}, "test"))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model.double().eval()


@pytest.fixture(scope="module")
def loops():
    """layout → the adapter of a tiny float64 model."""
    return {"tiny": ParcaeLoop(build(TINY)), "mixed": ParcaeLoop(build(MIXED, seed=1))}


def _alone(view, loops: int) -> list[list[int]]:
    """Each prompt decoded alone by recomputing its whole sequence at ``loops`` loops (no cache)."""
    options = DecodeOptions(GenerationExit("fixed", loops), "none")
    return [generate(view, [prompt], NEW, options).tokens[0] for prompt in PROMPTS]


# ---------------------------------------------------------------- the published layout


BLOCK_KEYS = ["norm_1.weight", "attn.c_q.weight", "attn.c_k.weight", "attn.c_v.weight", "attn.c_proj.weight",
              "norm_2.weight", "mlp.fc.weight", "mlp.proj.weight"]  # fmt: skip


@pytest.mark.parametrize(
    "name, blocks, width, size", [("parcae-140m", 2, 768, 144_323_136), ("parcae-770m", 6, 1280, 776_655_680)]
)
def test_the_published_configs_build_the_published_names_and_size(name, blocks, width, size):
    config = ParcaeConfig.from_dict(published(name), name)
    assert (config.n_embd, config.mean_recurrence, config.padded_vocab_size) == (width, 8, 32768)
    assert (config.embed_scale, config.logit_scale, config.head_dim) == (1.0, 1.0, 128)
    with torch.device("meta"):
        model = ParcaeForCausalLM(config)
    odd = range(1, blocks, 2)  # value embeddings and their gates: every odd block of each part
    expected = {"transformer.wte.weight", "transformer.ln_prelude.weight", "transformer.adapter.A_log",
                "transformer.adapter.dt_bias", "transformer.adapter.B", "transformer.C.weight",
                "transformer.ln_f.weight", "lm_head.weight"}  # fmt: skip
    for part in ("prelude", "core_block", "coda"):
        expected |= {f"transformer.{part}.{i}.{key}" for i in range(blocks) for key in BLOCK_KEYS}
        expected |= {f"transformer.{part}.{i}.attn.ve_gate.weight" for i in odd}
    expected |= {f"value_embeds.{i}.weight" for i in range(1, 3 * blocks, 2)}
    assert set(model.state_dict()) == expected
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: counted once
    assert sum(p.numel() for p in model.parameters()) == size  # the reference's count, key for key


def test_the_family_record_reads_the_published_config():
    config = ParcaeConfig.from_dict(published("parcae-770m"), "770m")
    assert (FAMILY.native_loops(config), FAMILY.core_layers(config), FAMILY.state_width(config)) == (8, 6, 1280)
    assert FAMILY.config_class_names == ("ParcaeConfig",) and FAMILY.model_types == {"parcae": None}


def applied(config: ParcaeConfig) -> list[tuple[str, int]]:
    """The blocks that add a value embedding to their values."""
    sites = ("prelude", "core", "coda")
    return [(site, i) for site in sites for i in range(config.blocks(site)) if config.value_table(site, i)]


def test_value_embeddings_sit_where_the_reference_applies_them():
    assert applied(ParcaeConfig.from_dict(published(), "140m")) == [("prelude", 1), ("core", 1), ("coda", 1)]
    # (2, 1, 2) blocks: tables at 0, 2, 4 (5 blocks), gates at odd layer ids (n_layer 1 × 4), the coda's ids from 10
    config = ParcaeConfig.from_dict({**published(), **MIXED}, "mixed")
    assert config.value_tables() == [0, 2, 4] and applied(config) == [("coda", 1)]
    assert [config.gated("prelude", i) for i in range(2)] == [False, True]  # a gate without a table: unused


@pytest.mark.parametrize("sizes", [TINY, MIXED], ids=["tiny", "mixed"])
def test_a_checkpoint_saved_as_the_reference_saves_it_loads_key_for_key(tmp_path, sizes):
    """config.json (the config saved whole) and pytorch_model.bin (the state dict, tied head and rotary table in
    it), read in float64: the same logits as the model saved."""
    raw = {**published(), **sizes}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model = build(sizes).float()
    torch.save({**model.state_dict(), "freqs_cis": torch.zeros(1, 128, 1, 4, 2)}, tmp_path / "pytorch_model.bin")
    loaded = ParcaeForCausalLM.from_dir(tmp_path, ParcaeConfig.from_dict(raw, "config.json"), torch.float64, "cpu")
    assert loaded.config.tie_embeddings == (loaded.lm_head.weight is loaded.transformer.wte.weight)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert torch.equal(ParcaeLoop(loaded)(ids), ParcaeLoop(model.double())(ids))


def test_a_checkpoint_lacking_a_weight_is_refused_naming_it(tmp_path):
    raw = {**published(), **TINY}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    state = build(TINY).float().state_dict()
    del state["value_embeds.3.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(LooplabError, match="lacks 1 weight\\(s\\) the model needs: value_embeds.3.weight"):
        ParcaeForCausalLM.from_dir(tmp_path, ParcaeConfig.from_dict(raw, "config.json"), torch.float64, "cpu")


@pytest.mark.skipif("parcae" not in LOOPED_FAMILIES, reason="Parcae is not registered in looplab.lm.families yet")
def test_a_model_dir_without_model_type_opens_as_parcae(tmp_path):
    from looplab.lm.model_dir import open_model_dir
    from tests.lm_dirs import tiny_tokenizer

    raw = {**published(), **TINY}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    torch.save(build(TINY).float().state_dict(), tmp_path / "pytorch_model.bin")
    tiny_tokenizer().save_pretrained(tmp_path)
    model_dir = open_model_dir(tmp_path)
    assert (model_dir.kind, model_dir.model_type, model_dir.native_loops) == ("native", "parcae", 8)
    assert isinstance(model_dir.load(torch.float64), ParcaeLoop)


# ---------------------------------------------------------------- the adapter


def test_a_padded_batch_equals_each_row_alone(loops):
    for loop in loops.values():
        width = max(map(len, PROMPTS))
        ids = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
        valid = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in PROMPTS])
        with torch.no_grad():
            batched = loop(ids, valid, 3)
            for row, prompt in enumerate(PROMPTS):
                alone = loop(torch.tensor([prompt]), None, 3)[0]
                assert torch.allclose(batched[row, : len(prompt)], alone, rtol=0, atol=1e-10)


def test_the_state_starts_at_zero_and_the_references_random_start_is_seeded(loops):
    loop = loops["tiny"]
    ids = torch.tensor([PROMPTS[0]])
    assert bool((loop.start(ids)[0] == 0).all())
    random = ParcaeLoop(build(TINY), state_init="random")  # the config's like-init: a truncated normal
    draws = [random.start(ids, generator=torch.Generator().manual_seed(seed))[0] for seed in (1, 1, 2)]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert draws[0].shape == (1, len(PROMPTS[0]), 32) and draws[0].dtype == torch.float64
    assert 0 < float(draws[0].abs().max()) <= 3 * (2 / (5 * 32)) ** 0.5  # cut at 3 std
    with pytest.raises(LooplabError, match="generation starts Parcae's state at zero"):
        ParcaeDecoding(random)


@pytest.mark.parametrize("kind", ["like-init", "normal", "embed", "unit", "zero"])
def test_each_of_the_references_starts_is_drawn_from_the_generator(kind):
    loop = ParcaeLoop(build({**TINY, "state_init": kind}), state_init="random")
    ids = torch.tensor([PROMPTS[0]])
    first, again = (loop.start(ids, generator=torch.Generator().manual_seed(3))[0] for _ in range(2))
    assert torch.equal(first, again) and bool((first == 0).all()) == (kind == "zero")
    if kind == "unit":
        assert torch.allclose(first.mean(-1), torch.zeros(1, len(PROMPTS[0]), dtype=first.dtype), atol=1e-6)


def test_a_random_like_init_start_of_a_strategy_without_its_std_is_refused():
    with pytest.raises(LooplabError, match="state_init='random' draws like-init for init_strategy in small, scaled"):
        ParcaeLoop(build({**TINY, "init_strategy": "mitchell"}), state_init="random")


def test_logits_are_read_at_each_rows_own_depth_and_soft_capped(loops):
    """forward_at_depths at one depth for every row runs in start's context, whose token ids the value
    embeddings read (rows at different depths need at_depths to narrow that context: see the module docstring)."""
    loop = loops["mixed"]
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    with torch.no_grad():
        at_three = loop.forward_at_depths(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([3, 3]))
        assert torch.equal(at_three, loop(ids, None, 3))
    assert at_three.dtype == torch.float64 and float(at_three.abs().max()) < 4.0  # logit_softcap


def test_the_injection_decay_is_the_diagonal_and_below_one(loops):
    adapter = loops["tiny"].injection
    with torch.no_grad():
        decay = loops["tiny"].injection_decay()
        dt = torch.nn.functional.softplus(adapter.dt_bias)
        assert torch.equal(decay, torch.exp(-dt * torch.exp(adapter.A_log))) and float(decay.max()) < 1
        # one loop of the injection alone, with no input: the state scaled by the decay, channel by channel
        h, e = torch.randn(1, 2, 32, dtype=torch.float64), torch.zeros(1, 2, 32, dtype=torch.float64)
        assert torch.allclose(adapter(h, e), h * decay)
    with pytest.raises(LooplabError, match="the 'linear' injection has no diagonal decay"):
        loops["mixed"].injection_decay()


def test_layer_hooks_see_each_site_and_a_context_from_valid_alone_is_refused(loops):
    loop = loops["tiny"]
    seen = []

    def hook(site, index, layer, x, run):
        seen.append((site, index))
        return run(x)

    with loop.observe(hook), torch.no_grad():
        loop(torch.tensor([PROMPTS[1]]), None, 2)
    assert seen == [("prelude", 0), ("prelude", 1), *[("core", 0), ("core", 1)] * 2, ("coda", 0), ("coda", 1)]
    h, e, ctx = loop.start(torch.tensor(PROMPTS[:1] * 2))
    assert torch.equal(ctx.select(torch.tensor([1])).tokens, torch.tensor([PROMPTS[0]]))
    with pytest.raises(LooplabError, match=r"value embeddings read the token ids: its context comes from start\(\)"):
        loop.step(h, e, loop.context(torch.ones(2, len(PROMPTS[0]))))


# ---------------------------------------------------------------- decoders against the full recompute


@pytest.mark.parametrize("layout", ["tiny", "mixed"])
@pytest.mark.parametrize("count", [1, 2, 16])
def test_the_cached_step_decoder_equals_each_prompt_recomputed_alone(loops, layout, count):
    view = ParcaeDecoding(loops[layout])
    batched = generate(view, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", count), "per_loop"))
    assert batched.tokens == _alone(view, count)


@pytest.mark.parametrize("layout", ["tiny", "mixed"])
def test_self_speculative_decoding_equals_the_fixed_depth(loops, layout):
    view = ParcaeDecoding(loops[layout])
    options = DecodeOptions(
        GenerationExit("fixed", 4), decoder="speculative", decoder_params={"draft_loops": 1, "draft_tokens": 3}
    )
    assert generate(view, PROMPTS, NEW, options).tokens == _alone(view, 4)


def test_shared_and_last_m_caches_run_in_flat_memory_and_meet_per_loop_where_they_must(loops):
    view = ParcaeDecoding(loops["mixed"])
    runs = {
        (cache, count, str(params)): generate(
            view, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", count), cache, cache_params=params)
        )
        for cache, count, params in [
            ("per_loop", 8, None),
            ("shared", 8, None),
            ("last_m", 8, None),
            ("shared", 1, None),
            ("per_loop", 1, None),
            ("last_m", 3, {"keep_loops": 3}),
            ("per_loop", 3, None),
        ]  # fmt: skip
    }
    size = {key: run.cache_bytes for key, run in runs.items()}
    # one core block held 8 loops, 1 or 2; the prelude, coda (2 + 2 blocks) and the slots' token ids once in all
    core = size["per_loop", 8, "None"] - size["shared", 8, "None"]
    assert core == 7 * (size["last_m", 8, "None"] - size["shared", 8, "None"]) > 0
    assert runs["shared", 1, "None"].tokens == runs["per_loop", 1, "None"].tokens  # one loop: the same keys
    assert runs["last_m", 3, "{'keep_loops': 3}"].tokens == runs["per_loop", 3, "None"].tokens  # m = the cap


def test_a_state_exit_reads_the_state_alone(loops):
    """latent-diff's first token exits where the prompt's own unroll settles (no ids or tables in the state)."""
    loop = loops["tiny"]
    run = generate(ParcaeDecoding(loop), PROMPTS, NEW, DecodeOptions(GenerationExit("latent-diff", 16, {"eps": 0.3})))
    with torch.no_grad():
        states = [h[0, -1] for h in loop.unroll(torch.tensor([PROMPTS[0]]), None, 16)]
    changes = [float((b - a).norm() / b.norm()) for a, b in zip(states, states[1:])]
    assert run.depths[0][0] == next((t + 2 for t, change in enumerate(changes) if change < 0.3), 16)


@pytest.mark.parametrize(
    "options, message",
    [
        (DecodeOptions(GenerationExit("fixed", 2), decoder="depth"), "depth-wise batching runs chains of pre-norm"),
        (DecodeOptions(GenerationExit("fixed", 2), decoder="wavefront"), "runs chains of pre-norm layers"),
        (DecodeOptions(GenerationExit("gate", 3, {"threshold": 0.5})), "reads a learned exit gate, which this model"),
    ],
)
def test_what_the_view_cannot_run_is_refused_in_one_line(loops, options, message):
    with pytest.raises(LooplabError, match=message):
        generate(ParcaeDecoding(loops["tiny"]), PROMPTS, NEW, options)


# ---------------------------------------------------------------- refused configs


BAD = [
    ({"mean_recurrence": 0}, "mean_recurrence must be an integer in 1..4096, got 0"),
    ({"mean_recurrence": 1.5}, "mean_recurrence must be an integer in 1..4096, got 1.5"),
    ({"mean_recurrence": "8"}, "mean_recurrence must be an integer in 1..4096, got '8'"),
    ({"n_embd": 30}, r"n_embd \(30\) must be num_attention_heads \(4\) × an even head width"),
    ({"n_embd": 36}, r"n_embd \(36\) must be num_attention_heads \(4\) × an even head width"),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ({"injection_type": "gated"}, "injection_type must be one of 'diagonal', 'linear', 'add', got 'gated'"),
    ({"state_init": "random"}, "state_init must be one of 'like-init', 'normal', 'embed', 'unit', 'zero'"),
    ({"recurrent_iteration_method": "per-layer"}, "recurrent_iteration_method must be one of"),
    ({"use_fused_head": "hhe"}, "use_fused_head must be one of 'pytorch', 'cce', 'full-triton', got 'hhe'"),
    ({"use_fused_head": "full-triton", "tie_embeddings": False}, "use_fused_head 'full-triton' stores an untied"),
    ({"block_class_name": "SandwichBlock"}, "block_class_name must be one of 'TransformerPreNormBlock'"),
    ({"norm_class_name": "RMSNorm_llama"}, "norm_class_name must be one of 'RMSNorm', 'LayerNorm'"),
    ({"nonlin_name": "Tanh"}, "nonlin_name must be one of 'ReLU2', 'ReLU', 'GELU', 'SiLU', got 'Tanh'"),
    ({"init_strategy": "xavier"}, "init_strategy must be one of 'mitchell'"),
    ({"mup_model_scaling_factor": 2}, "mup_model_scaling_factor must be one of 1, got 2"),
    ({"rope_settings": {"use_rope": False}}, "rope_settings must be an object {use_rope: true"),
    ({"rope_settings": {"rope_base": 0}}, "rope_settings must be an object"),
    ({"_class_name": "GPTConfig"}, "_class_name must be one of 'ParcaeConfig', got 'GPTConfig'"),
    ({"_is_recurrent_block_config": True}, "_is_recurrent_block_config must be one of False"),
    ({"clip_qkv": 0}, "clip_qkv must be a finite number > 0 or null, got 0"),
    ({"logit_softcap": "15"}, "logit_softcap must be a finite number > 0 or null"),
    ({"n_layers_in_recurrent_block": 0}, "n_layers_in_recurrent_block must be an integer ≥ 1, got 0"),
    ({"recurrent_embedding_dimension": 48}, r"recurrent_embedding_dimension \(48\) must be the core's heads \(4\)"),
    ({"injection_type": "add", "recurrent_embedding_dimension": 16, "recurrent_num_attention_heads": 2},
     r"injection_type 'add' needs recurrent_embedding_dimension = n_embd \(32\)"),
    ({"qk_bias": True, "num_key_value_heads": 2}, "qk_bias needs num_key_value_heads = num_attention_heads"),
    ({"num_key_value_heads": 2}, r"recurrent_num_attention_heads \(4\) must equal num_key_value_heads \(2\)"),
    ({"n_embd": 16, "recurrent_embedding_dimension": 16},
     r"a prelude block with a value embedding gates it on its first 32 channels: its width \(16\)"),
]  # fmt: skip


@pytest.mark.parametrize("fields, message", BAD, ids=lambda v: str(v)[:40] if isinstance(v, dict) else None)
def test_a_config_looplab_cannot_run_is_refused_naming_the_field(fields, message):
    with pytest.raises(LooplabError, match=f"^config.json: {message}") as refused:
        ParcaeConfig.from_dict({**published(), **TINY, **fields}, "config.json")
    assert "\n" not in str(refused.value)


def test_an_unknown_state_init_of_the_adapter_is_refused():
    with pytest.raises(LooplabError, match="unknown Parcae state_init 'noise'; valid choices: zero, random"):
        ParcaeLoop(build(TINY), state_init="noise")


#: a core narrower than the prelude and coda (4 heads of 8 dims against 8 of 8; no value embedding in it)
NARROW_CORE = dict(TINY, n_embd=64, num_attention_heads=8, num_key_value_heads=8, recurrent_embedding_dimension=32,
                   recurrent_num_attention_heads=4, n_layers_in_recurrent_block=1, injection_type="linear")  # fmt: skip


@pytest.mark.parametrize("cache", ["per_loop", "shared"])
@pytest.mark.parametrize("layout", ["tiny", "mixed", "narrow core"])
def test_a_paged_decoder_gives_the_dense_decoders_floats(loops, layout, cache):
    """Keys and values paged in a pool of the model's shape — the narrow core's calls, of another shape, kept
    dense beside it — give the dense cache's tokens, loops and log-probabilities exactly; every block goes
    back when the rows are released."""
    if layout == "narrow core":
        loops = {layout: ParcaeLoop(build(NARROW_CORE, seed=2))}
    from looplab.generation.cache import kv_shape
    from looplab.generation.paged import BlockPool
    from looplab.generation.step import Decoder
    from looplab.generation.views import decodable

    view = decodable(loops[layout])
    options = DecodeOptions(GenerationExit("fixed", 3), cache)
    with torch.no_grad():
        dense = Decoder(view, PROMPTS, NEW, options).run()
        pool = BlockPool(*kv_shape(view), "cpu", blocks=2000, slots=4)
        decoder = Decoder(view, PROMPTS, NEW, options, pool=pool)
        paged = decoder.run()
    assert (paged.tokens, paged.depths, paged.logprobs) == (dense.tokens, dense.depths, dense.logprobs)
    decoder.cache.release(torch.arange(len(PROMPTS)))
    assert pool.used == 0
