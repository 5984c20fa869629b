"""Huginn-0125 (``model_type`` ``huginn_raven``, ``RavenForCausalLM``), read natively: no remote code.

The published model (3.5B: width 5280, 55 heads, (2, 4, 2) blocks, 32 recurrences by default):

    e = prelude(wte[tokens] · sqrt(d))                        2 blocks, once per token
    x = x_0                                                   zeros here (see below)
    repeat N times:  x = core(adapter([x, e]))                 one loop: the concat adapter, then 4 blocks
    logits = lm_head(ln_f(coda(ln_f(x))))                     2 blocks; the same ln_f twice; lm_head tied to wte

Every block is a sandwich: x = RMS_2(attn(RMS_1(x)) + x); x = RMS_4(mlp(RMS_3(x)) + x) (the *sum* is
normed). Attention projects q, k, v with one matrix ``Wqkv``, adds a learned bias to q and k
(``qk_bias`` [2, 1, H, Dh]) before RoPE, rotates *adjacent pairs* (x_2i, x_2i+1) with base
``rope_base`` (50000) in float32, and attends causally at scale Dh^−½; the MLP is a gated SiLU with
one fused ``fc`` (first half the gate, second the up projection).

Differences from the reference code, on purpose:
- the recurrent state starts at **zero** by default, deterministic; the reference draws x_0 from a
  truncated normal on torch's global generator unless ``init_scale = 0``. ``state_init="random"``
  draws it as the reference does (std sqrt(2 / 5d) · init_scale, cut at 3 std, times sqrt(d)), from
  the generator ``start`` is given (the run's seed);
- the attention mask is honoured (the reference ignores ``attention_mask``, so a padded batch attends
  to its padding);
- the rotary table is computed, not read: a stored ``freqs_cis`` buffer is accepted and ignored.

Pairs are rotated as rotate-half on de-interleaved heads: queries and keys are laid out (x_0, x_2, …,
x_1, x_3, …) before RoPE, which leaves every dot product q·k the reference computes unchanged, so one
rotation (:func:`looplab.model.attention.apply_rope`) and one cache layout serve every family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.config_fields import boolean, check_fields, integer, one_of, positive_number
from looplab.lm.native import DecodingShape, ModelFamily, NativeLoop, pair_rope_tables
from looplab.lm.retrofit import LayerContext, causal_mask
from looplab.model.attention import apply_rope
from looplab.model.decoding import Capabilities
from looplab.token_exits import MAX_LOOPS

__all__ = ["HuginnConfig", "RavenForCausalLM", "HuginnLoop", "HuginnDecoding"]

STATE_INITS = ("zero", "random")


#: every config.json field the model reads: its type and domain (:mod:`looplab.lm.config_fields`); the
#: published model's choices where looplab implements no other
HUGINN_FIELDS = {
    **dict.fromkeys(("n_embd", "hidden_size", "n_heads", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "vocab_size", "block_size", "n_layers_in_recurrent_block"), integer()),
    **dict.fromkeys(("n_layers_in_prelude", "n_layers_in_coda"), integer(0)),
    "mean_recurrence": integer(1, MAX_LOOPS),
    "norm_eps": positive_number(),
    "rope_base": positive_number(),
    **dict.fromkeys(("qk_bias", "tie_embeddings"), boolean()),
    "bias": one_of(False),
    "injection_type": one_of("linear"),
    "nonlin_name": one_of("SiLU"),
    "block_class_name": one_of("SandwichBlock"),
    "mlp_class_name": one_of("GatedMLP"),
    "norm_class_name": one_of("RMSNorm_llama"),
    "state_init": one_of("like-init"),
    "test_time_noise": one_of(0, 0.0),
}  # fmt: skip


@dataclass
class HuginnConfig:
    """The fields of a Huginn (``RavenConfig``) ``config.json`` this module reads, at the reference's defaults."""

    n_embd: int = 5280
    n_heads: int = 55
    intermediate_size: int = 17920
    vocab_size: int = 65536
    block_size: int = 4096
    n_layers_in_prelude: int = 2
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 2
    mean_recurrence: int = 32
    norm_eps: float = 1e-6
    rope_base: float = 50000.0
    qk_bias: bool = True
    bias: bool = False
    tie_embeddings: bool = True
    injection_type: str = "linear"
    nonlin_name: str = "SiLU"
    block_class_name: str = "SandwichBlock"
    mlp_class_name: str = "GatedMLP"
    model_type: str = "huginn_raven"
    extra: dict = field(default_factory=dict, repr=False)

    #: config.json keys the reference maps onto its own names (``RavenConfig.attribute_map``)
    ALIASES = {"num_attention_heads": "n_heads", "hidden_size": "n_embd"}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> HuginnConfig:
        check_fields(data, HUGINN_FIELDS, where)
        data = {cls.ALIASES.get(k, k): v for k, v in data.items()}
        known = {name for name in cls.__dataclass_fields__ if name != "extra"}
        config = cls(
            **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
        )
        config.check(where)
        return config

    def check(self, where: str) -> None:
        """Refuse a config the model cannot be built from, in one line naming the field (each field's type and
        domain by :data:`HUGINN_FIELDS`, checked in :meth:`from_dict`; here what relates two fields)."""
        if self.n_embd % self.n_heads or (self.n_embd // self.n_heads) % 2:
            raise LooplabError(f"{where}: n_embd ({self.n_embd}) must be n_heads ({self.n_heads}) × an even head width")
        kv_heads = self.extra.get("num_key_value_heads", self.n_heads)
        if kv_heads != self.n_heads:
            raise LooplabError(f"{where}: num_key_value_heads must equal the heads ({self.n_heads}), got {kv_heads}")

    # the names the rest of looplab reads off a config
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def max_position_embeddings(self) -> int:
        return self.block_size

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads


class RMSNorm(nn.Module):
    """Huginn's RMSNorm: (x / sqrt(mean(x²) + eps)) in float32, cast back, times the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class HuginnAttention(nn.Module):
    """Fused q, k, v with the q / k bias, RoPE on adjacent pairs, causal attention (published names)."""

    def __init__(self, config: HuginnConfig):
        super().__init__()
        d, self.heads, self.head_dim = config.n_embd, config.n_heads, config.head_dim
        self.scaling = self.head_dim**-0.5
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        if config.qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, self.heads, self.head_dim))
        else:
            self.qk_bias = None
        self.proj = nn.Linear(d, d, bias=False)
        # (x_0, x_2, …, x_1, x_3, …): adjacent pairs rotated as rotate-half halves
        self.register_buffer("pairs", torch.cat([torch.arange(0, self.head_dim, 2), torch.arange(1, self.head_dim, 2)]),
                             persistent=False)  # fmt: skip

    def project_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v [B, H, T, Dh] of x [B, T, d]: the bias added to q and k, both de-interleaved (before RoPE)."""
        batch, length, _ = x.shape
        q, k, v = self.Wqkv(x).view(batch, length, 3, self.heads, self.head_dim).unbind(2)
        if self.qk_bias is not None:
            q, k = (q + self.qk_bias[0]).to(q.dtype), (k + self.qk_bias[1]).to(q.dtype)
        q, k = q[..., self.pairs], k[..., self.pairs]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def merge_heads(self, y: Tensor) -> Tensor:
        """The output projection of the heads' outputs y [B, T, H·Dh]."""
        return self.proj(y)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """(output [B, T, d], probabilities [B, H, T, T]) under the additive ``mask`` [B, 1, T, T]."""
        q, k, v = self.project_heads(x)
        cos, sin = rope
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        scores = (q.float() @ k.float().transpose(-1, -2)) * self.scaling + mask.float()
        probs = scores.softmax(dim=-1).to(v.dtype)
        y = (probs @ v).transpose(1, 2).reshape(x.shape)
        return self.merge_heads(y), probs


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in float32 (as the reference), on x [B, H, T, Dh] with (cos, signed sin) [T, Dh]."""
    return apply_rope(x.float(), cos, sin).to(x.dtype)


class GatedMLP(nn.Module):
    """proj(silu(gate) · up) with [gate | up] = fc(x) (published names)."""

    def __init__(self, config: HuginnConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(nn.functional.silu(gate) * up)


class SandwichBlock(nn.Module):
    """One Huginn block (see the module docstring); ``attn_residual`` / ``mlp_residual`` serve the cached decoder."""

    def __init__(self, config: HuginnConfig):
        super().__init__()
        d, eps = config.n_embd, config.norm_eps
        self.norm_1, self.attn, self.norm_2 = RMSNorm(d, eps), HuginnAttention(config), RMSNorm(d, eps)
        self.mlp, self.norm_3, self.norm_4 = GatedMLP(config), RMSNorm(d, eps), RMSNorm(d, eps)

    def attn_residual(self, x: Tensor, attend) -> Tensor:
        return self.norm_2(attend(self.norm_1(x)) + x)

    def mlp_residual(self, x: Tensor, mlp) -> Tensor:
        return self.norm_4(mlp(self.norm_3(x)) + x)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        return self.mlp_residual(self.attn_residual(x, lambda y: self.attn(y, mask, rope)[0]), self.mlp)


class RavenForCausalLM(nn.Module):
    """Huginn under its published parameter names: ``transformer.{wte, prelude, adapter, core_block, coda, ln_f}``
    and ``lm_head`` (tied to ``wte``, not stored)."""

    def __init__(self, config: HuginnConfig):
        super().__init__()
        self.config = config
        blocks = lambda count: nn.ModuleList(SandwichBlock(config) for _ in range(count))  # noqa: E731
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "prelude": blocks(config.n_layers_in_prelude),
                "adapter": nn.Linear(2 * config.n_embd, config.n_embd, bias=False),
                "core_block": blocks(config.n_layers_in_recurrent_block),
                "coda": blocks(config.n_layers_in_coda),
                "ln_f": RMSNorm(config.n_embd, config.norm_eps),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    @classmethod
    def from_dir(cls, path: Path, config: HuginnConfig, dtype: torch.dtype, device: str) -> RavenForCausalLM:
        """The model of ``config`` with the weights of the model dir ``path`` (checked key by key)."""
        from looplab.lm.weights import build_loaded

        embedding = "transformer.wte" if config.tie_embeddings else None
        model = build_loaded(cls, config, path, dtype, device, embedding, ignored=("freqs_cis",))
        for module in model.modules():  # the non-persistent pair order, lost on the meta device
            if isinstance(module, HuginnAttention):
                module.pairs = torch.cat([torch.arange(0, module.head_dim, 2), torch.arange(1, module.head_dim, 2)]).to(
                    device
                )
        return model


def rope_tables(config: HuginnConfig, length: int, device) -> tuple[Tensor, Tensor]:
    """(cos, signed sin) [length, Dh] in float32 for de-interleaved heads (the reference's frequencies)."""
    return pair_rope_tables(config.head_dim, config.rope_base, length, device)


class HuginnLoop(NativeLoop):
    """Huginn's recurrence as the loop of the looped-model protocol (see the module docstring).

    Args:
        model: a :class:`RavenForCausalLM`.
        state_init: ``zero`` (default) or ``random`` (the reference's draw, from ``start``'s generator).
        init_scale: the random draw's scale (the reference's ``init_scale``).

    Layer hooks see sites ``"prelude"``, ``"core"`` and ``"coda"`` with each block's index there.
    """

    model_types = ("huginn_raven",)

    def __init__(self, model: RavenForCausalLM, *, state_init: str = "zero", init_scale: float = 1.0, **_):
        super().__init__()
        if not isinstance(model, RavenForCausalLM):
            raise LooplabError(f"{type(model).__name__} is not a Huginn causal LM (RavenForCausalLM)")
        if state_init not in STATE_INITS:
            raise LooplabError(f"unknown Huginn state_init {state_init!r}; valid choices: {', '.join(STATE_INITS)}")
        self.config, self.state_init, self.init_scale = model.config, state_init, init_scale
        self.native_loops = model.config.mean_recurrence
        parts = model.transformer
        self.embed, self.adapter, self.ln_f, self.lm_head = parts["wte"], parts["adapter"], parts["ln_f"], model.lm_head
        self.embed_scale = math.sqrt(model.config.n_embd)
        self.prelude, self.core, self.coda = parts["prelude"], parts["core_block"], parts["coda"]

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, LayerContext]:
        """(x_0, e, ctx): e = prelude(wte[ids] · sqrt(d)) [B, T, d]; x_0 zeros (or the reference's random draw)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        ctx = self.context(attention_mask)
        x = self.embed(input_ids) * self.embed_scale
        for index, block in enumerate(self.prelude):
            x = self._block("prelude", index, block, x, ctx)
        return self.initial_state(x, generator), x, ctx

    def initial_state(self, e: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """x_0 [B, T, d]: zeros, or the reference's truncated normal times sqrt(d) drawn from ``generator``."""
        if self.state_init == "zero" or self.init_scale == 0:
            return torch.zeros_like(e)
        std = math.sqrt(2 / (5 * self.config.n_embd)) * self.init_scale
        x = torch.empty(e.shape, dtype=torch.float32)
        nn.init.trunc_normal_(x, std=std, a=-3 * std, b=3 * std, generator=generator)
        return (x * self.embed_scale).to(dtype=e.dtype, device=e.device)

    def context(self, valid: Tensor) -> LayerContext:
        device = self.embed.weight.device
        rope = rope_tables(self.config, valid.shape[1], device)
        return LayerContext(rope, causal_mask(valid.to(device), torch.float32), valid.bool().to(device))

    def step(self, h: Tensor, e: Tensor, ctx: LayerContext) -> Tensor:
        """One recurrence: the adapter on [h, e], then the core blocks."""
        x = self.adapter(torch.cat([h, e], dim=-1))
        for index, block in enumerate(self.core):
            x = self._block("core", index, block, x, ctx)
        return x

    def readout(self, h: Tensor, ctx: LayerContext, at: Tensor | None = None) -> Tensor:
        """Logits lm_head(ln_f(coda(ln_f(h)))) [B, T, V], or [N, V] at the positions ``at`` [B, T] selects
        (the coda attends over the whole sequence first)."""
        x = self.ln_f(h)
        for index, block in enumerate(self.coda):
            x = self._block("coda", index, block, x, ctx)
        x = self.ln_f(x)
        return self.lm_head(x if at is None else x[at])

    def watch_attention(self, layer: nn.Module):
        from looplab.lm.retrofit import watch_decoder_attention

        return watch_decoder_attention(layer, layer.attn)

    def _block(self, site: str, index: int, block: nn.Module, x: Tensor, ctx: LayerContext) -> Tensor:
        return self._run(site, index, block, x, lambda y: block(y, ctx.mask, ctx.rope))


class HuginnDecoding(nn.Module):
    """A :class:`HuginnLoop` in the shape the cached decoder reads (:mod:`looplab.generation.step`): the
    prelude and coda once per token, one cache entry per (recurrence, core block) under ``per_loop``;
    ``shared`` is Huginn's own cache (one entry per core block, each token's last recurrence)."""

    capabilities = Capabilities(passes=frozenset({"coda"}), rope=True, layerwise=True)

    def __init__(self, loop: HuginnLoop):
        super().__init__()
        if loop.state_init != "zero":
            raise LooplabError("generation starts Huginn's state at zero (state_init='zero'): a random start "
                               "would need a draw per token")  # fmt: skip
        self.loop = loop
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=config.n_heads,
            kv_heads=config.n_heads,
            d_model=config.n_embd,
            head_dim=config.head_dim,
            coda_layers=len(loop.coda),
            max_len=config.block_size,
            init_state="zero",
        )
        self.positions, self.head, self.final_norm, self.core_out_norm = None, loop.lm_head, loop.ln_f, None
        self.prelude, self.core, self.coda = list(loop.prelude), list(loop.core), list(loop.coda)

    def embedding(self, tokens: Tensor) -> Tensor:
        return self.loop.embed(tokens) * self.loop.embed_scale

    def initial_state(self, e: Tensor) -> Tensor:
        return torch.zeros_like(e)

    def core_input(self, h: Tensor, e: Tensor) -> Tensor:
        return self.loop.adapter(torch.cat([h, e], dim=-1))

    def coda_pass(self, h: Tensor, calls) -> Tensor:
        """ln_f, then the coda blocks through their cache (the logits apply ln_f once more)."""
        x = self.loop.ln_f(h)
        for index, block in enumerate(self.coda):
            x = calls.layer(index, block, x)
        return x

    def rope_tables(self, length: int, device, dtype) -> tuple[Tensor, Tensor]:
        cos, sin = rope_tables(self.loop.config, length, device)
        return cos.to(dtype), sin.to(dtype)

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)


FAMILY = ModelFamily(
    name="Huginn-0125",
    model_types={"huginn_raven": None},
    adapter=HuginnLoop,
    view=HuginnDecoding,
    native_loops=lambda config: config.mean_recurrence,
    one_loop="the concat adapter on [state, prelude output], then the core blocks",
    core_layers=lambda config: config.n_layers_in_recurrent_block,
    state_width=lambda config: config.n_embd,
    config_reader=HuginnConfig.from_dict,
    model=RavenForCausalLM,
)
