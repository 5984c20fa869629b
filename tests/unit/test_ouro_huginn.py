"""Ouro and Huginn-0125, read natively: the published layout and configs, every decoder against the adapter's
own full recompute in float64, the gate exit in both semantics, Huginn's state start.

(The adapters were held against the reference code, run outside the repository: the closing note of the
change that added them gives the table.)"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from looplab.errors import LooplabError  # noqa: E402
from looplab.generation import generate  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.lm.families import LOOPED_FAMILIES  # noqa: E402
from looplab.lm.huginn import HuginnConfig, HuginnLoop, RavenForCausalLM  # noqa: E402
from looplab.lm.model_dir import open_model_dir  # noqa: E402
from looplab.lm.ouro import OuroConfig, OuroForCausalLM  # noqa: E402
from looplab.token_exits import GenerationExit  # noqa: E402
from tests.lm_dirs import save_own_family  # noqa: E402

PROMPTS = [[3, 5, 7, 9, 11, 2, 4], [6, 8], [10, 12, 14, 1]]
NEW = 5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family → (model dir, the adapter loaded in float64)."""
    root = tmp_path_factory.mktemp("own_families")
    out = {}
    for family in ("ouro", "huginn", "nanbeige"):
        path = save_own_family(family, root / family)
        out[family] = (path, open_model_dir(path).load(torch.float64))
    return out


def _alone(loop, loops: int) -> list[list[int]]:
    """Each prompt decoded alone by recomputing its whole sequence at ``loops`` loops (no cache)."""
    return [
        generate(loop, [prompt], NEW, DecodeOptions(GenerationExit("fixed", loops), "none")).tokens[0]
        for prompt in PROMPTS
    ]


# ---------------------------------------------------------------- the published layout


OURO_LAYER_KEYS = [
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
    "input_layernorm_2.weight", "post_attention_layernorm.weight", "post_attention_layernorm_2.weight",
]  # fmt: skip
HUGINN_BLOCK_KEYS = [
    "norm_1.weight", "norm_2.weight", "norm_3.weight", "norm_4.weight", "attn.Wqkv.weight", "attn.qk_bias",
    "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight",
]  # fmt: skip


@pytest.mark.parametrize("name, layers", [("ouro-1.4b_config.json", 24), ("ouro-2.6b_config.json", 48)])
def test_the_published_ouro_configs_build_the_published_names_and_size(name, layers):
    from tests.lm_dirs import PUBLISHED

    config = OuroConfig.from_dict(json.loads((PUBLISHED / name).read_text()), name)
    assert (config.total_ut_steps, config.early_exit_threshold, config.rope_theta) == (4, 1.0, 1e6)
    assert (config.num_hidden_layers, config.head_dim, config.num_key_value_heads) == (layers, 128, 16)
    with torch.device("meta"):
        model = OuroForCausalLM(config)
    expected = {"model.embed_tokens.weight", "model.norm.weight", "model.early_exit_gate.weight",
                "model.early_exit_gate.bias", "lm_head.weight"}  # fmt: skip
    expected |= {f"model.layers.{i}.{key}" for i in range(layers) for key in OURO_LAYER_KEYS}
    assert set(model.state_dict()) == expected
    size = sum(p.numel() for p in model.parameters())
    assert (1.3e9 < size < 1.5e9) if layers == 24 else (2.5e9 < size < 2.8e9), size


def test_the_published_huginn_config_builds_the_published_names_and_size():
    from tests.lm_dirs import PUBLISHED

    raw = json.loads((PUBLISHED / "huginn-0125_raven_config_minimal.json").read_text())
    config = HuginnConfig.from_dict(raw, "huginn")
    assert (config.n_embd, config.n_heads, config.head_dim, config.mean_recurrence) == (5280, 55, 96, 32)
    assert (config.n_layers_in_prelude, config.n_layers_in_recurrent_block, config.n_layers_in_coda) == (2, 4, 2)
    with torch.device("meta"):
        model = RavenForCausalLM(config)
    blocks = [("prelude", 2), ("core_block", 4), ("coda", 2)]
    expected = {"transformer.wte.weight", "transformer.adapter.weight", "transformer.ln_f.weight", "lm_head.weight"}
    expected |= {f"transformer.{part}.{i}.{key}" for part, n in blocks for i in range(n) for key in HUGINN_BLOCK_KEYS}
    assert set(model.state_dict()) == expected
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: stored once
    assert 3.4e9 < sum(p.numel() for p in model.parameters()) < 3.7e9


@pytest.mark.parametrize("family", ["ouro", "huginn"])
def test_a_scaled_down_published_checkpoint_opens_with_every_key(models, family):
    path, loop = models[family]
    model_dir = open_model_dir(path)
    assert model_dir.kind == "native" and model_dir.native_loops == (3 if family == "ouro" else 4)
    assert model_dir.model_type == json.loads((path / "config.json").read_text())["model_type"]
    assert "auto_map" in json.loads((path / "config.json").read_text())  # present, and never read
    assert isinstance(loop, LOOPED_FAMILIES[model_dir.model_type].adapter)


def test_huginn_accepts_a_stored_rotary_table(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_own_family("huginn", tmp_path / "huginn")
    weights = load_file(path / "model.safetensors")
    save_file({**weights, "freqs_cis": torch.zeros(1, 128, 1, 4, 2)}, str(path / "model.safetensors"))
    loop = open_model_dir(path).load()
    assert loop(torch.tensor([PROMPTS[0]])).shape[-1] == loop.lm_head.out_features


# ---------------------------------------------------------------- decoders against the full recompute


@pytest.mark.parametrize("family", ["ouro", "huginn"])
@pytest.mark.parametrize("loops", [1, 2, 6])
def test_the_cached_step_decoder_equals_each_prompt_recomputed_alone(models, family, loops):
    _, loop = models[family]
    batched = generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", loops), "per_loop"))
    assert batched.tokens == _alone(loop, loops)


@pytest.mark.parametrize(
    "family, rule, decoder",
    [
        ("ouro", GenerationExit("gate", 3, {"threshold": 0.5}), "depth"),
        ("ouro", GenerationExit("gate", 3, {"threshold": 0.8}), "wavefront"),
        ("huginn", GenerationExit("fixed", 4), "depth"),
        ("huginn", GenerationExit("latent-diff", 12, {"eps": 1.0}), "depth"),
    ],
    ids=["ouro-gate-depth", "ouro-gate-wavefront", "huginn-fixed-depth", "huginn-latent-diff-depth"],
)
def test_the_gate_exit_and_huginn_batch_tokens_at_different_loops_exactly(models, family, rule, decoder):
    """Depth-wise and wavefront batching take Ouro's gated view and Huginn's coda: the step decoder's tokens and
    exit loops, the exits spread over several loops."""
    _, loop = models[family]
    step = generate(loop, PROMPTS, NEW, DecodeOptions(rule, "per_loop"))
    batched = generate(loop, PROMPTS, NEW, DecodeOptions(rule, "per_loop", decoder=decoder))
    assert (batched.tokens, batched.depths) == (step.tokens, step.depths)
    assert rule.name == "fixed" or len({d for row in step.depths for d in row}) > 1


@pytest.mark.parametrize("batching", ["depth", "wavefront"])
def test_ouros_layers_batch_depth_wise_and_by_wavefront_exactly(models, batching):
    _, loop = models["ouro"]
    run = generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 3), decoder=batching))
    assert run.tokens == _alone(loop, 3)


@pytest.mark.parametrize("family", ["ouro", "huginn"])
def test_self_speculative_decoding_equals_the_fixed_depth(models, family):

    _, loop = models[family]
    run = generate(
        loop,
        PROMPTS,
        NEW,
        DecodeOptions(
            GenerationExit("fixed", 4), decoder="speculative", decoder_params={"draft_loops": 1, "draft_tokens": 3}
        ),
    )
    assert run.tokens == _alone(loop, 4)


def test_huginn_runs_its_own_shared_cache_and_last_m_in_flat_memory(models):
    _, loop = models["huginn"]
    sizes = {
        cache: generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit("fixed", 8), cache)).cache_bytes
        for cache in ("per_loop", "shared", "last_m")
    }
    # per_loop holds 8 loops of the 2 core blocks; shared one, last_m two; prelude and coda one each in all
    core, once = 2, 2  # core blocks; prelude + coda blocks
    assert sizes["per_loop"] / sizes["shared"] == pytest.approx((8 * core + once) / (core + once))
    assert sizes["last_m"] / sizes["shared"] == pytest.approx((2 * core + once) / (core + once))


# ---------------------------------------------------------------- the gate exit


def _gate_reference(loop, threshold: float, cap: int) -> tuple[list[list[int]], list[list[int]]]:
    """Tokens and exit loops of each prompt alone, every loop recomputed over the whole sequence and the next
    token read at the first loop whose cumulative exit probability reaches ``threshold`` (Ouro's forward)."""
    tokens, depths = [], []
    for prompt in PROMPTS:
        sequence, row_tokens, row_depths = list(prompt), [], []
        for _ in range(NEW):
            with torch.no_grad():
                states = list(loop.unroll(torch.tensor([sequence]), None, cap))
                reached = loop.exit_distribution([h[0, -1] for h in states]).cumsum(0) >= threshold
            exit_loop = int(reached.nonzero()[0]) if bool(reached.any()) else cap - 1
            with torch.no_grad():
                token = int(loop.readout(states[exit_loop], None)[0, -1].argmax())
            sequence.append(token)
            row_tokens.append(token)
            row_depths.append(exit_loop + 1)
        tokens.append(row_tokens)
        depths.append(row_depths)
    return tokens, depths


@pytest.mark.parametrize("threshold", [0.5, 0.8, 1.0])
def test_the_read_only_gate_exit_is_ouros_own_forward(models, threshold):
    _, loop = models["ouro"]
    run = generate(
        loop,
        PROMPTS,
        NEW,
        DecodeOptions(GenerationExit("gate", 3, {"threshold": threshold}), decoder_params={"read_only_exit": True}),
    )
    tokens, depths = _gate_reference(loop, threshold, 3)
    assert (run.tokens, run.depths) == (tokens, depths)
    if threshold < 1:
        assert min(d for row in depths for d in row) < 3  # the gate exits early somewhere: the test has teeth


def test_the_gate_exit_that_skips_loops_agrees_on_the_first_token_and_saves_loops(models):
    _, loop = models["ouro"]
    rule = GenerationExit("gate", 3, {"threshold": 0.5})
    skipping, read_only = (
        generate(loop, PROMPTS, NEW, DecodeOptions(rule)),
        generate(loop, PROMPTS, NEW, DecodeOptions(rule, decoder_params={"read_only_exit": True})),
    )
    assert [row[0] for row in skipping.tokens] == [row[0] for row in read_only.tokens]
    assert [row[0] for row in skipping.depths] == [row[0] for row in read_only.depths]
    assert all(1 <= d <= 3 for row in skipping.depths for d in row)
    assert skipping.mean_depth < 3


@pytest.mark.parametrize(
    "family, options, message",
    [
        ("huginn", {}, "the gate exit reads a learned exit gate, which this model lacks (Ouro has one)"),
        ("ouro", {"decoder": "depth", "decoder_params": {"read_only_exit": True}}, "unknown parameter of the depth"),
    ],
)
def test_what_the_gate_exit_refuses_is_one_line(models, family, options, message):
    _, loop = models[family]
    with pytest.raises(LooplabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit("gate", 3, {"threshold": 0.5}), **options))


def test_the_exit_distribution_sums_to_one_and_one_loop_takes_it_all(models):
    _, loop = models["ouro"]
    with torch.no_grad():
        states = list(loop.unroll(torch.tensor([PROMPTS[0]]), None, 3))
        p = loop.exit_distribution(states)
        assert p.shape == (3, 1, len(PROMPTS[0])) and torch.allclose(p.sum(0), torch.ones_like(p[0]))
        assert torch.equal(loop.exit_distribution(states[:1]), torch.ones(1, 1, len(PROMPTS[0])))


@pytest.mark.parametrize("threshold", [0.0, 1.5, -1.0])
def test_a_gate_threshold_outside_0_1_is_refused(threshold):
    with pytest.raises(LooplabError, match="threshold"):
        GenerationExit("gate", 3, {"threshold": threshold})


# ---------------------------------------------------------------- Huginn's state start and exits


def test_huginns_state_starts_at_zero_and_the_references_random_start_is_seeded(models):
    _, loop = models["huginn"]
    ids = torch.tensor([PROMPTS[0]])
    h0, _, _ = loop.start(ids)
    assert bool((h0 == 0).all())
    random = HuginnLoop(loop_model(loop), state_init="random")
    draws = [random.start(ids, generator=torch.Generator().manual_seed(seed))[0] for seed in (1, 1, 2)]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert float(draws[0].abs().max()) <= 3 * (2 / (5 * 32)) ** 0.5 * 32**0.5 + 1e-9  # cut at 3 std, times sqrt(d)


def loop_model(loop: HuginnLoop) -> RavenForCausalLM:
    """A RavenForCausalLM around the adapter's own modules."""
    model = RavenForCausalLM.__new__(RavenForCausalLM)
    torch.nn.Module.__init__(model)
    model.config = loop.config
    model.transformer = torch.nn.ModuleDict(
        {
            "wte": loop.embed,
            "prelude": loop.prelude,
            "adapter": loop.adapter,
            "core_block": loop.core,
            "coda": loop.coda,
            "ln_f": loop.ln_f,
        }  # fmt: skip
    )
    model.lm_head = loop.lm_head
    return model


@pytest.mark.parametrize("name, threshold", [("latent-diff", 0.5), ("cosine", 0.05)])
def test_huginns_state_exits_stop_where_the_state_settles(models, name, threshold):
    _, loop = models["huginn"]
    run = generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit(name, 16, {"eps": threshold})))
    with torch.no_grad():  # the first token's exit, from the unroll of the prompt alone
        states = [h[0, -1] for h in loop.unroll(torch.tensor([PROMPTS[0]]), None, 16)]
    changes = [
        float((b - a).norm() / b.norm()) if name == "latent-diff" else float(1 - torch.cosine_similarity(a, b, dim=0))
        for a, b in zip(states, states[1:])
    ]
    expected = next((t + 2 for t, change in enumerate(changes) if change < threshold), 16)
    assert run.depths[0][0] == expected


def _criterion(name: str, logp: torch.Tensor, before: torch.Tensor) -> float:
    """The value each logit-reading exit compares with its eps, from the whole forward's log-probabilities."""
    from looplab.token_exits import _entropy, _minp

    if name == "entropy-diff":
        return float((_entropy(logp) - _entropy(before)).abs())
    if name == "minp-kl":
        now, earlier = _minp(logp), _minp(before)
        return float((earlier.exp() * (earlier - now)).sum())
    if name == "reverse-kl":  # Huginn's own direction, KL(p_{t-1} ‖ p_t)
        return float((before.exp() * (before - logp)).sum())
    return float((logp.exp() * (logp - before)).sum())  # kl


def _last_logps(loop, loops: int) -> list[torch.Tensor]:
    """The first prompt's last-token log-probabilities after each of ``loops`` loops, from the whole forward."""
    with torch.no_grad():
        return [
            loop.readout(h, loop.context(torch.ones(1, len(PROMPTS[0]))))[0, -1].log_softmax(-1)
            for h in loop.unroll(torch.tensor([PROMPTS[0]]), None, loops)
        ]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_huginns_argmax_stability_counts_the_loops_its_argmax_stood(models, steps):
    """The exit carries its count across a token's loops (Huginn's reference ArgmaxStabilityExitEvaluator), on
    the Ouro dir, whose argmax settles within 16 loops (the tiny Huginn's never does)."""
    _, loop = models["ouro"]
    argmaxes = [int(logp.argmax()) for logp in _last_logps(loop, 16)]
    stood, expected = 0, 16
    for t in range(1, 16):
        stood = stood + 1 if t > 1 and argmaxes[t - 1] == argmaxes[t - 2] else 0
        if stood >= steps:
            expected = t
            break
    run = generate(loop, PROMPTS, NEW, DecodeOptions(GenerationExit("argmax-stability", 16, {"steps": steps})))
    assert run.depths[0][0] == expected
    assert steps < expected < 16  # the count starts at 0 (a token runs at least steps + 1 loops); it stops early


@pytest.mark.parametrize("name", ["entropy-diff", "minp-kl", "kl", "reverse-kl"])
def test_exits_that_read_logits_run_huginns_coda_per_loop(models, name):
    """The first token's exit (the prefill's query) is where the whole forward's logits settle."""
    _, loop = models["huginn"]
    logps = _last_logps(loop, 12)
    values = [_criterion(name, now, before) for before, now in zip(logps, logps[1:])]  # loops 2..12
    eps = sorted(values)[len(values) // 2] * 1.0001  # a threshold the values cross mid-way
    expected = next(t + 2 for t, value in enumerate(values) if value < eps)
    params = {"eps": eps, "direction": "reverse"} if name == "reverse-kl" else {"eps": eps}
    rule = GenerationExit("kl" if name == "reverse-kl" else name, 12, params)
    run = generate(loop, PROMPTS, NEW, DecodeOptions(rule))
    assert run.depths[0][0] == expected
    assert all(1 <= d <= 12 for row in run.depths for d in row)


@pytest.mark.parametrize("family", ["ouro", "huginn", "nanbeige"])
def test_checkpointing_each_loop_gives_the_same_gradients(models, family):
    """``train.checkpoint_loops``: each loop recomputed in the backward pass, the gradients unchanged."""
    from looplab.model.depths import at_depths

    _, loop = models[family]
    ids, depths = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]]), torch.tensor([3, 2])
    grads = []
    for checkpointed in (False, True):
        loop.zero_grad()
        loop.checkpoint_loops = checkpointed
        logits, _ = at_depths(loop, ids, torch.ones_like(ids, dtype=torch.bool), depths)
        logits.square().mean().backward()
        grads.append([p.grad.clone() for p in loop.parameters() if p.grad is not None])
    loop.checkpoint_loops = False
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(*grads))
