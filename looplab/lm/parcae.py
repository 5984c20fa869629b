"""Parcae (SandyResearch's stable looped LM, arXiv 2604.12946), read natively from its own checkpoints: a
``config.json`` that is the reference's config dataclass saved whole (``_class_name`` ``ParcaeConfig``, no
``model_type``) beside ``pytorch_model.bin``. No reference code runs.

The published models (140M: width 768, 6 heads, (2, 2, 2) blocks; 770M: width 1280, 10 heads, (6, 6, 6);
8 recurrences, vocabulary 32768, the head tied to the embedding):

    e = ln_prelude(prelude(wte[tokens]))                  once per token (wte × embed scale: 1 in the published)
    x = x_0                                               zeros here (see below)
    repeat N times:  x = core(decay ⊙ x + Δ ⊙ (e Bᵀ))     one loop: the diagonal injection, then the core blocks
    logits = lm_head(ln_f(coda(C x)))                     × logit scale (1), soft-capped where logit_softcap is set

with Δ = softplus(dt_bias) and decay = exp(−Δ · exp(A_log)) per state channel: the injection is a linear
recurrence of spectral radius max(decay) < 1, the paper's stability argument (:meth:`ParcaeLoop.injection_decay`).
The reference's other injections are read too: ``linear`` (a Linear on [x, e]) and ``add`` (x + e).

Every block is pre-norm, attn(norm_1 x) + x, then mlp(norm_2 x) + x; the published MLP is proj(½·relu(fc x)²).
Attention projects q, k, v apart (grouped keys and values in the prelude and coda; the core blocks, built from
the reference's recurrent config, have as many key/value heads as heads), adds a gated value embedding where
the reference does, clips q, k, v (``clip_qkv``), adds a q/k bias (``qk_bias``), RMS-normalises q and k per head
without a weight (``qk_norm``), rotates *adjacent pairs* (x_2i, x_2i+1) by RoPE (``rope_settings``) and
attends causally at scale Dh^−½.

Value embeddings: a table ``value_embeds.{i}`` [V, kv width] for each i in 0..P+R+C−1 of the parity of
P+R+C−1, and a gate ``attn.ve_gate`` (Linear(32, kv heads)) in each block whose *layer id* has the parity of
n_layer − 1, n_layer = R · mean_backprop_depth. Block j of the prelude, core and coda has layer id j, P + j
and P + R·N + j (N = mean_recurrence) but reads table j, P + j and P + R + j; where both exist,
v += 2σ(ve_gate(x[..., :32])) ⊙ value_embeds(tokens). Where only one exists the reference computes nothing
from it, and neither does looplab (:meth:`ParcaeConfig.value_table`): with R·(N − 1) odd (R = 1, N = 8, say)
the coda's tables and gates sit at opposite parities and only some of them meet.

Differences from the reference code, on purpose:
- the recurrent state starts at **zero** by default, deterministic; the reference draws x_0 per ``state_init``
  (``like-init`` in the published configs: a truncated normal on torch's global generator).
  ``state_init="random"`` draws it as the reference does, from the generator ``start`` is given;
- the attention mask is honoured (the reference ignores ``attention_mask``: a padded batch attends to its
  padding);
- the loop count is the caller's (the reference's own forward draws a Poisson depth per sequence unless one
  is given); the training-only fields (sampling, backprop depth, checkpointing, fused losses) are not read,
  but for mean_backprop_depth's part in placing the value-embedding gates;
- the rotary table is computed from ``rope_settings``: a stored ``freqs_cis`` buffer is accepted and ignored;
- q and k are RMS-normalised before the rotation, not after: a rotation keeps each head's norm, so this is
  the same to rounding, and lets the cached decoder rotate as for every other family (pairs are rotated as
  rotate-half on de-interleaved heads, which leaves every q·k unchanged);
- logits are in float32 or wider (the reference's float32; float64 in a float64 model).

The value embeddings read the token ids, so the adapter's context carries them (:class:`ParcaeContext`): the
one ``start`` builds, narrowed by ``ctx.select(rows)`` (what depth-wise readouts, halting schedules, the
regularisers' probes and the spectral analysis keep); one built by ``context(valid)`` alone is refused by
any block that needs them, in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.config_fields import boolean, check_fields, integer, one_of, positive_number
from looplab.lm.huginn import RMSNorm
from looplab.lm.native import DecodingShape, ModelFamily, NativeLoop, pair_rope_tables
from looplab.lm.retrofit import LayerContext, causal_mask
from looplab.model.attention import apply_rope
from looplab.model.decoding import Capabilities
from looplab.token_exits import MAX_LOOPS

__all__ = ["ParcaeConfig", "ParcaeForCausalLM", "ParcaeLoop", "ParcaeDecoding"]

STATE_INITS = ("zero", "random")
SITES = ("prelude", "core", "coda")
#: channels of a block's attention input the value-embedding gate reads
VE_GATE_CHANNELS = 32
#: the reference's init strategies (parcae_lm/utils/init.py); at inference they set two scales alone
INIT_STRATEGIES = (
    "mitchell", "normal", "llama", "llama-by-dim", "llama-by-dim-ls", "kaiming", "bert", "megatron", "megatron2",
    "small", "scaled", "scaled-geiping", "scaled-zero", "scaled-stuck", "takase", "takase-scaled", "wang",
    "deepnorm-straight", "deepnorm-subln", "noci-anagnostidis", "shaped", "deep-scale-simple", "deep-scale-full",
    "scaled-and-logit-scale", "bernstein", "illiterate", "scaled-large-embed",
)  # fmt: skip
#: the strategies whose table scales the embeddings, and those that scale the logits, by the width d
EMBED_SCALES = {"takase": math.sqrt, "takase-scaled": math.sqrt}
LOGIT_SCALES = {
    "takase-scaled": lambda d: math.sqrt(2 / 5) / math.sqrt(d),
    **dict.fromkeys(("llama-by-dim-ls", "noci-anagnostidis", "shaped", "deep-scale-simple", "deep-scale-full",
                     "scaled-and-logit-scale"), lambda d: 1 / math.sqrt(d)),
}  # fmt: skip
#: the strategies whose embedding std is sqrt(2 / 5d): the std of the reference's like-init start
SMALL_INIT = ("small", "scaled", "scaled-geiping", "scaled-zero", "scaled-stuck", "takase", "takase-scaled")


def _optional(rule):
    """``rule``, or null (the reference's None: the option off)."""

    def check(value):
        need = None if value is None else rule(value)
        return None if need is None else f"{need} or null"

    return check


def _rope_settings(value):
    ok = (
        isinstance(value, dict)
        and set(value) <= {"use_rope", "rope_condense_ratio", "rope_base"}
        and value.get("use_rope", True) is True
        and integer()(value.get("rope_condense_ratio", 1)) is None
        and positive_number()(value.get("rope_base", 50000)) is None
    )
    return None if ok else "an object {use_rope: true, rope_condense_ratio: an integer ≥ 1, rope_base: a number > 0}"


#: every config.json field the model reads: its type and domain (:mod:`looplab.lm.config_fields`); the
#: reference's choices where looplab implements no other
PARCAE_FIELDS = {
    **dict.fromkeys(("n_embd", "num_attention_heads", "vocab_size", "padding_multiple", "block_size",
                     "recurrent_embedding_dimension", "recurrent_intermediation_embedding_dimension"), integer()),
    **dict.fromkeys(("num_key_value_heads", "intermediate_size", "padded_vocab_size",
                     "recurrent_num_attention_heads"), integer(optional=True)),
    **dict.fromkeys(("n_layers_in_prelude", "n_layers_in_coda", "mean_backprop_depth"), integer(0)),
    "n_layers_in_recurrent_block": integer(),
    "mean_recurrence": integer(1, MAX_LOOPS),
    "norm_eps": positive_number(),
    **dict.fromkeys(("clip_qkv", "logit_softcap"), _optional(positive_number())),
    "rope_settings": _rope_settings,
    **dict.fromkeys(("bias", "qk_bias", "qk_norm", "prelude_norm", "tie_embeddings", "simple_ops"), boolean()),
    "injection_type": one_of("diagonal", "linear", "add"),
    "state_init": one_of("like-init", "normal", "embed", "unit", "zero"),
    "norm_class_name": one_of("RMSNorm", "LayerNorm"),
    "mlp_class_name": one_of("BaseMLP", "GatedMLP"),
    "nonlin_name": one_of("ReLU2", "ReLU", "GELU", "SiLU"),
    "init_strategy": one_of(*INIT_STRATEGIES),
    "use_fused_head": one_of("pytorch", "cce", "full-triton"),
    "block_class_name": one_of("TransformerPreNormBlock"),
    "recurrent_iteration_method": one_of("per-batch", "per-sequence", "per-token"),
    "mup_model_scaling_factor": one_of(1),
    "model_class_name": one_of("Parcae"),
    "_is_recurrent_block_config": one_of(False),
    "_class_name": one_of("ParcaeConfig"),
}  # fmt: skip


def _alternates(index: int, count: int) -> bool:
    """The reference's ``has_ve``: every other index, the last of ``count`` always among them."""
    return index % 2 == (count - 1) % 2


@dataclass
class ParcaeConfig:
    """The fields of a Parcae ``config.json`` this module reads, at the reference's defaults."""

    n_embd: int = 4096
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # default: num_attention_heads
    intermediate_size: int | None = None  # default: 4 · n_embd
    vocab_size: int = 50254
    padding_multiple: int = 512
    padded_vocab_size: int | None = None  # default: vocab_size rounded up to padding_multiple
    block_size: int = 4096
    rope_settings: dict = field(default_factory=dict)
    norm_class_name: str = "LayerNorm"
    norm_eps: float = 1e-5
    mlp_class_name: str = "BaseMLP"
    nonlin_name: str = "GELU"
    bias: bool = False
    qk_bias: bool = False
    qk_norm: bool = False
    clip_qkv: float | None = None
    logit_softcap: float | None = None
    init_strategy: str = "scaled"
    simple_ops: bool = False
    use_fused_head: str = "pytorch"
    injection_type: str = "diagonal"
    n_layers_in_prelude: int = 1
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 1
    state_init: str = "like-init"
    recurrent_embedding_dimension: int = 1024
    recurrent_intermediation_embedding_dimension: int = 3520
    recurrent_num_attention_heads: int | None = None  # default: num_attention_heads
    prelude_norm: bool = False
    mean_recurrence: int = 32
    mean_backprop_depth: int = 8
    tie_embeddings: bool = False
    model_type: str = "parcae"  # the family's name in looplab: the config.json has none
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> ParcaeConfig:
        check_fields(data, PARCAE_FIELDS, where)
        known = {name for name in cls.__dataclass_fields__ if name not in ("extra", "model_type")}
        config = cls(
            **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
        )
        config.check(where)
        return config

    def check(self, where: str) -> None:
        """Refuse a config the reference cannot build, or looplab does not run, in one line naming the field (each
        field's type and domain by :data:`PARCAE_FIELDS`, checked in :meth:`from_dict`; here what relates two)."""
        heads = self.num_attention_heads
        self.num_key_value_heads = self.num_key_value_heads or heads
        self.intermediate_size = self.intermediate_size or 4 * self.n_embd
        if self.padded_vocab_size is None:
            self.padded_vocab_size = -(-self.vocab_size // self.padding_multiple) * self.padding_multiple

        def refuse(message: str) -> LooplabError:
            return LooplabError(f"{where}: {message}")

        if self.n_embd % heads or self.head_dim % 2:
            raise refuse(f"n_embd ({self.n_embd}) must be num_attention_heads ({heads}) × an even head width")
        if heads % self.num_key_value_heads:
            raise refuse(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
                         f"({self.num_key_value_heads})")  # fmt: skip
        if self.recurrent_embedding_dimension != self.core_heads * self.head_dim:
            raise refuse(
                f"recurrent_embedding_dimension ({self.recurrent_embedding_dimension}) must be the core's heads "
                f"({self.core_heads}) × the head width {self.head_dim}: one rotary table serves every block"
            )
        if self.injection_type == "add" and self.recurrent_embedding_dimension != self.n_embd:
            raise refuse(f"injection_type 'add' needs recurrent_embedding_dimension = n_embd ({self.n_embd})")
        if self.qk_bias and self.num_key_value_heads != heads and self.n_layers_in_prelude + self.n_layers_in_coda:
            raise refuse("qk_bias needs num_key_value_heads = num_attention_heads (the reference adds one bias "
                         "per query head to the keys)")  # fmt: skip
        if self.use_fused_head == "full-triton" and not self.tie_embeddings:
            raise refuse("use_fused_head 'full-triton' stores an untied head transposed, which looplab does not read")
        for site in SITES:
            count = self.blocks(site)
            width, kv_heads = (self.recurrent_embedding_dimension, self.core_heads) if site == "core" else (
                self.n_embd, self.num_key_value_heads)  # fmt: skip
            if any(self.value_table(site, i) is not None for i in range(count)):
                if width < VE_GATE_CHANNELS:
                    raise refuse(f"a {site} block with a value embedding gates it on its first {VE_GATE_CHANNELS} "
                                 f"channels: its width ({width}) must be ≥ {VE_GATE_CHANNELS}")  # fmt: skip
                if kv_heads != self.num_key_value_heads:
                    raise refuse(
                        f"recurrent_num_attention_heads ({self.core_heads}) must equal num_key_value_heads "
                        f"({self.num_key_value_heads}): a core block adds a value embedding to its values"
                    )

    # the names the rest of looplab reads off a config
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def max_position_embeddings(self) -> int:
        return self.block_size

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.num_attention_heads

    @property
    def core_heads(self) -> int:
        """Heads of the core blocks, as many for keys and values (the reference's recurrent config)."""
        return self.recurrent_num_attention_heads or self.num_attention_heads

    @property
    def embed_scale(self) -> float:
        return float(EMBED_SCALES.get(self.init_strategy, lambda d: 1.0)(self.n_embd))

    @property
    def logit_scale(self) -> float:
        return float(LOGIT_SCALES.get(self.init_strategy, lambda d: 1.0)(self.n_embd))

    def blocks(self, site: str) -> int:
        return {"prelude": self.n_layers_in_prelude, "core": self.n_layers_in_recurrent_block,
                "coda": self.n_layers_in_coda}[site]  # fmt: skip

    def value_tables(self) -> list[int]:
        """The indices of the ``value_embeds`` tables."""
        count = sum(self.blocks(site) for site in SITES)
        return [i for i in range(count) if _alternates(i, count)]

    def gated(self, site: str, index: int) -> bool:
        """Whether block ``index`` of ``site`` has a value-embedding gate (by its layer id)."""
        prelude, core = self.n_layers_in_prelude, self.n_layers_in_recurrent_block
        first = {"prelude": 0, "core": prelude, "coda": prelude + core * self.mean_recurrence}[site]
        return _alternates(first + index, core * self.mean_backprop_depth)

    def value_table(self, site: str, index: int) -> str | None:
        """The ``value_embeds`` key block ``index`` of ``site`` adds to its values, or None (no table or no gate)."""
        prelude, core = self.n_layers_in_prelude, self.n_layers_in_recurrent_block
        key = {"prelude": 0, "core": prelude, "coda": prelude + core}[site] + index
        return str(key) if key in self.value_tables() and self.gated(site, index) else None


def _relu2(x: Tensor) -> Tensor:
    return F.relu(x).pow(2).mul(0.5)


NONLINEARITIES = {"ReLU2": _relu2, "ReLU": F.relu, "GELU": F.gelu, "SiLU": F.silu}


def _norm(config: ParcaeConfig, width: int) -> nn.Module:
    if config.norm_class_name == "RMSNorm" or config.simple_ops:  # simple_ops swaps every norm for RMSNorm
        return RMSNorm(width, config.norm_eps)
    return nn.LayerNorm(width, eps=config.norm_eps)


def _pairs_apart(x: Tensor) -> Tensor:
    """[..., Dh] laid out (x_0, x_2, …, x_1, x_3, …): adjacent pairs become rotate-half's halves."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class ParcaeAttention(nn.Module):
    """q, k, v apart, the gated value embedding, clipping, q/k bias, q/k norm; RoPE outside (published names)."""

    def __init__(self, config: ParcaeConfig, width: int, heads: int, kv_heads: int, gated: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.scaling = self.head_dim**-0.5
        self.clip, self.qk_norm = config.clip_qkv, config.qk_norm
        self.c_q = nn.Linear(width, width, bias=config.bias)
        self.c_k = nn.Linear(width, kv_heads * self.head_dim, bias=config.bias)
        self.c_v = nn.Linear(width, kv_heads * self.head_dim, bias=config.bias)
        self.c_proj = nn.Linear(width, width, bias=config.bias)
        self.qk_bias = nn.Parameter(torch.zeros(2, 1, heads, self.head_dim)) if config.qk_bias else None
        self.ve_gate = nn.Linear(VE_GATE_CHANNELS, kv_heads, bias=False) if gated else None

    def project_heads(self, x: Tensor, ve: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, T, Dh], k, v [B, H_kv, T, Dh] of x [B, T, d] before RoPE (q and k de-interleaved), with
        the value embedding ve [B, T, H_kv·Dh] gated into v where given."""
        batch, length, _ = x.shape
        q = self.c_q(x).view(batch, length, self.heads, self.head_dim)
        k = self.c_k(x).view(batch, length, self.kv_heads, self.head_dim)
        v = self.c_v(x).view(batch, length, self.kv_heads, self.head_dim)
        if ve is not None:
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :VE_GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(batch, length, self.kv_heads, self.head_dim)
        if self.clip is not None:
            q, k, v = (t.clamp(min=-self.clip, max=self.clip) for t in (q, k, v))
        if self.qk_bias is not None:
            q, k = (q + self.qk_bias[0]).to(q.dtype), (k + self.qk_bias[1]).to(q.dtype)
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        return _pairs_apart(q).transpose(1, 2), _pairs_apart(k).transpose(1, 2), v.transpose(1, 2)

    def merge_heads(self, y: Tensor) -> Tensor:
        """The output projection of the heads' outputs y [B, T, H·Dh]."""
        return self.c_proj(y)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor], ve: Tensor | None = None):
        """(output [B, T, d], probabilities [B, H, T, T]) under the additive ``mask`` [B, 1, T, T]."""
        q, k, v = self.project_heads(x, ve)
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        if self.kv_heads != self.heads:
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        wide = torch.promote_types(q.dtype, torch.float32)
        scores = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * self.scaling + mask
        probs = scores.softmax(dim=-1).to(v.dtype)
        y = (probs @ v).transpose(1, 2).flatten(-2)
        return self.merge_heads(y), probs


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in float32 or wider (as the reference), on x [B, H, T, Dh] with (cos, signed sin) [T, Dh]."""
    wide = torch.promote_types(x.dtype, torch.float32)
    return apply_rope(x.to(wide), cos.to(wide), sin.to(wide)).to(x.dtype)


class ParcaeMLP(nn.Module):
    """proj(f(fc x)) (``BaseMLP``) or proj(f(a) · b) with [a | b] = fc(x) (``GatedMLP``) (published names)."""

    def __init__(self, config: ParcaeConfig, width: int, inner: int):
        super().__init__()
        self.gated, self.nonlinearity = config.mlp_class_name == "GatedMLP", NONLINEARITIES[config.nonlin_name]
        self.fc = nn.Linear(width, inner * (2 if self.gated else 1), bias=config.bias)
        self.proj = nn.Linear(inner, width, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        if not self.gated:
            return self.proj(self.nonlinearity(self.fc(x)))
        a, b = self.fc(x).chunk(2, dim=-1)
        return self.proj(self.nonlinearity(a) * b)


class ParcaeBlock(nn.Module):
    """One pre-norm block; ``attn_residual`` / ``mlp_residual`` serve the cached decoder."""

    def __init__(self, config: ParcaeConfig, width: int, inner: int, heads: int, kv_heads: int, gated: bool):
        super().__init__()
        self.norm_1, self.attn = _norm(config, width), ParcaeAttention(config, width, heads, kv_heads, gated)
        self.norm_2, self.mlp = _norm(config, width), ParcaeMLP(config, width, inner)

    def attn_residual(self, x: Tensor, attend) -> Tensor:
        return attend(self.norm_1(x)) + x

    def mlp_residual(self, x: Tensor, mlp) -> Tensor:
        return mlp(self.norm_2(x)) + x

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor], ve: Tensor | None = None) -> Tensor:
        return self.mlp_residual(self.attn_residual(x, lambda y: self.attn(y, mask, rope, ve)[0]), self.mlp)


class DiagonalInjection(nn.Module):
    """decay ⊙ x + Δ ⊙ (e Bᵀ), Δ = softplus(dt_bias), decay = exp(−Δ · exp(A_log)) (published names)."""

    def __init__(self, config: ParcaeConfig):
        super().__init__()
        state = config.recurrent_embedding_dimension
        self.A_log, self.dt_bias = nn.Parameter(torch.zeros(state)), nn.Parameter(torch.zeros(state))
        self.B = nn.Parameter(torch.zeros(state, config.n_embd))

    def decay(self) -> Tensor:
        """[state]: the factor each state channel keeps per loop."""
        return torch.exp(-F.softplus(self.dt_bias) * torch.exp(self.A_log))

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        return x * self.decay() + F.softplus(self.dt_bias) * (e @ self.B.T)


class LinearInjection(nn.Module):
    """A Linear on [x, e] (the reference's ``linear`` injection)."""

    def __init__(self, config: ParcaeConfig):
        super().__init__()
        state = config.recurrent_embedding_dimension
        self.adapter = nn.Linear(state + config.n_embd, state, bias=config.bias)

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        return self.adapter(torch.cat([x, e], dim=-1))


class AdditiveInjection(nn.Module):
    """x + e (the reference's ``add`` injection)."""

    def __init__(self, config: ParcaeConfig):
        super().__init__()

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        return x + e


INJECTIONS = {"diagonal": DiagonalInjection, "linear": LinearInjection, "add": AdditiveInjection}


class ParcaeForCausalLM(nn.Module):
    """Parcae under its published parameter names: ``transformer.{wte, prelude, ln_prelude, adapter, core_block,
    C, coda, ln_f}``, ``value_embeds.{i}`` and ``lm_head`` (tied to ``wte`` where ``tie_embeddings``)."""

    def __init__(self, config: ParcaeConfig):
        super().__init__()
        self.config = config
        d, state, heads, kv_heads = (config.n_embd, config.recurrent_embedding_dimension, config.num_attention_heads,
                                     config.num_key_value_heads)  # fmt: skip

        def blocks(site: str, width: int, inner: int, heads: int, kv_heads: int) -> nn.ModuleList:
            gated = (config.gated(site, i) for i in range(config.blocks(site)))
            return nn.ModuleList(ParcaeBlock(config, width, inner, heads, kv_heads, gate) for gate in gated)

        parts = {
            "wte": nn.Embedding(config.padded_vocab_size, d),
            "prelude": blocks("prelude", d, config.intermediate_size, heads, kv_heads),
            "adapter": INJECTIONS[config.injection_type](config),
            "core_block": blocks("core", state, config.recurrent_intermediation_embedding_dimension,
                                 config.core_heads, config.core_heads),
            "C": nn.Linear(state, d, bias=config.bias),
            "coda": blocks("coda", d, config.intermediate_size, heads, kv_heads),
            "ln_f": _norm(config, d),
        }  # fmt: skip
        if config.prelude_norm:
            parts["ln_prelude"] = _norm(config, d)
        self.transformer = nn.ModuleDict(parts)
        kv_width = kv_heads * config.head_dim
        self.value_embeds = nn.ModuleDict(
            {str(i): nn.Embedding(config.padded_vocab_size, kv_width) for i in config.value_tables()}
        )
        self.lm_head = nn.Linear(d, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    @classmethod
    def from_dir(cls, path: Path, config: ParcaeConfig, dtype: torch.dtype, device: str) -> ParcaeForCausalLM:
        """The model of ``config`` with the weights of the model dir ``path`` (checked key by key)."""
        from looplab.lm.weights import build_loaded

        embedding = "transformer.wte" if config.tie_embeddings else None
        return build_loaded(cls, config, path, dtype, device, embedding, ignored=("freqs_cis",))


def rope_tables(config: ParcaeConfig, length: int, device) -> tuple[Tensor, Tensor]:
    """(cos, signed sin) [length, Dh] in float32 for de-interleaved heads (the reference's frequencies)."""
    settings = config.rope_settings
    base, condense = settings.get("rope_base", 50000), settings.get("rope_condense_ratio", 1)
    return pair_rope_tables(config.head_dim, base, length, device, condense)


@dataclass
class ParcaeContext(LayerContext):
    """A :class:`LayerContext` with the batch's token ids [B, T], which the value embeddings read."""

    tokens: Tensor | None = None

    def select(self, rows: Tensor | slice) -> ParcaeContext:
        chosen = super().select(rows)
        return replace(chosen, tokens=None if self.tokens is None else self.tokens[rows])


class ParcaeLoop(NativeLoop):
    """Parcae's recurrence as the loop of the looped-model protocol (see the module docstring).

    Args:
        model: a :class:`ParcaeForCausalLM`.
        state_init: ``zero`` (default) or ``random`` (the reference's draw for the config's ``state_init``, from
            ``start``'s generator).

    Layer hooks see sites ``"prelude"``, ``"core"`` and ``"coda"`` with each block's index there. The context
    carries the token ids (see the module docstring).
    """

    model_types = ("parcae",)

    def __init__(self, model: ParcaeForCausalLM, *, state_init: str = "zero", **_):
        super().__init__()
        if not isinstance(model, ParcaeForCausalLM):
            raise LooplabError(f"{type(model).__name__} is not a Parcae causal LM (ParcaeForCausalLM)")
        if state_init not in STATE_INITS:
            raise LooplabError(f"unknown Parcae state_init {state_init!r}; valid choices: {', '.join(STATE_INITS)}")
        config = model.config
        if state_init == "random" and config.state_init == "like-init" and config.init_strategy not in SMALL_INIT:
            raise LooplabError(f"state_init='random' draws like-init for init_strategy in {', '.join(SMALL_INIT)}; "
                               f"this config has {config.init_strategy!r}")  # fmt: skip
        self.config, self.state_init, self.native_loops = config, state_init, config.mean_recurrence
        parts = model.transformer
        self.embed, self.injection, self.C, self.ln_f = parts["wte"], parts["adapter"], parts["C"], parts["ln_f"]
        self.ln_prelude = parts["ln_prelude"] if config.prelude_norm else None
        self.prelude, self.core, self.coda = parts["prelude"], parts["core_block"], parts["coda"]
        self.value_embeds, self.lm_head = model.value_embeds, model.lm_head

    def start(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, ParcaeContext]:
        """(x_0, e, ctx): e = ln_prelude(prelude(wte[ids])) [B, T, d]; x_0 [B, T, d_state] zeros (or the
        reference's random draw)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        ctx = self.context(attention_mask, input_ids)
        x = self.embed_tokens(input_ids)
        for index, block in enumerate(self.prelude):
            x = self._block("prelude", index, block, x, ctx)
        if self.ln_prelude is not None:
            x = self.ln_prelude(x)
        return self.initial_state(x, generator), x, ctx

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        return x if self.config.embed_scale == 1 else x * self.config.embed_scale

    def initial_state(self, e: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """x_0 [B, T, d_state]: zeros, or the reference's draw for the config's ``state_init`` from ``generator``."""
        config, shape = self.config, (*e.shape[:-1], self.config.recurrent_embedding_dimension)
        kind = "zero" if self.state_init == "zero" else config.state_init
        if kind == "zero":
            return e.new_zeros(shape)
        x = torch.randn(shape, generator=generator)
        if kind == "embed":
            x = x / math.sqrt(config.n_embd)
        elif kind == "unit":
            std, mean = torch.std_mean(x, dim=-1, keepdim=True)
            x = (x - mean) / (std + 1e-8)
        elif kind == "like-init":
            std = math.sqrt(2 / (5 * config.n_embd))
            nn.init.trunc_normal_(x, std=std, a=-3 * std, b=3 * std, generator=generator)
            x = x * config.embed_scale
        return x.to(dtype=e.dtype, device=e.device)

    def context(self, valid: Tensor, tokens: Tensor | None = None) -> ParcaeContext:
        device = self.embed.weight.device
        rope = rope_tables(self.config, valid.shape[1], device)
        tokens = None if tokens is None else tokens.to(device)
        return ParcaeContext(rope, causal_mask(valid.to(device), torch.float32), valid.bool().to(device), tokens)

    def step(self, h: Tensor, e: Tensor, ctx: ParcaeContext) -> Tensor:
        """One recurrence: the injection of e into h, then the core blocks."""
        x = self.injection(h, e)
        for index, block in enumerate(self.core):
            x = self._block("core", index, block, x, ctx)
        return x

    def readout(self, h: Tensor, ctx: ParcaeContext, at: Tensor | None = None) -> Tensor:
        """Logits of lm_head(ln_f(coda(C h))) [B, T, V], or [N, V] at the positions ``at`` [B, T] selects (the
        coda attends over the whole sequence first)."""
        x = self.C(h)
        for index, block in enumerate(self.coda):
            x = self._block("coda", index, block, x, ctx)
        x = self.ln_f(x)
        return self.logits(x if at is None else x[at])

    def logits(self, x: Tensor) -> Tensor:
        """The head on final-normed states x [..., d]: in float32 or wider, scaled, soft-capped where set."""
        logits = self.lm_head(x)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * self.config.logit_scale
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def injection_decay(self) -> Tensor:
        """[d_state]: exp(−softplus(dt_bias) · exp(A_log)), what the diagonal injection keeps of each state
        channel per loop; its maximum is the injection's spectral radius (the paper's stability bound)."""
        if not isinstance(self.injection, DiagonalInjection):
            raise LooplabError(f"the {self.config.injection_type!r} injection has no diagonal decay (only 'diagonal')")
        return self.injection.decay()

    def injection_radius(self) -> float | None:
        """The spectral radius of the injection's own recurrence x ↦ decay ⊙ x, max(decay) (the paper's stability
        argument, which ``analyze spectral`` prints beside the loop map's); None for an injection without one."""
        if not isinstance(self.injection, DiagonalInjection):
            return None
        with torch.no_grad():
            return float(self.injection.decay().max())

    def value_embedding(self, site: str, index: int, tokens: Tensor | None) -> Tensor | None:
        """[B, T, kv width]: the value embedding block ``index`` of ``site`` adds for ``tokens``, or None."""
        key = self.config.value_table(site, index)
        if key is None:
            return None
        if tokens is None:
            raise LooplabError(
                "Parcae's value embeddings read the token ids: its context comes from start() (narrowed by "
                "ctx.select(rows)), not from context(valid) alone"
            )
        return self.value_embeds[key](tokens)

    def watch_attention(self, layer: nn.Module):
        from looplab.lm.retrofit import watch_decoder_attention

        return watch_decoder_attention(layer, layer.attn)

    def _block(self, site: str, index: int, block: nn.Module, x: Tensor, ctx: ParcaeContext) -> Tensor:
        ve = self.value_embedding(site, index, ctx.tokens)
        return self._run(site, index, block, x, lambda y: block(y, ctx.mask, ctx.rope, ve))


#: the decoder's per-slot store (looplab.generation.cache.KVCache.history) of the new tokens' ids
TOKEN_STORE = ("prelude", 0, "token_ids")


class ParcaeDecoding(nn.Module):
    """A :class:`ParcaeLoop` in the shape the cached decoder reads (:mod:`looplab.generation.decoder`).

    The value embeddings read each token's id inside attention, and the decoder hands a view its tokens at
    ``embedding`` alone: so ``embedding`` passes the ids through, the prelude pass embeds them and keeps them
    in the decoder's per-slot store, and the core and coda passes read them back for the slots they run. So
    each pass is the view's own (none is a chain of the decoder's layers: depth-wise and wavefront batching
    refuse it); every cache policy applies, one entry per (recurrence, core block) under ``per_loop``.
    """

    capabilities = Capabilities(passes=frozenset({"prelude", "core", "coda", "logits"}), rope=True)

    def __init__(self, loop: ParcaeLoop):
        super().__init__()
        if loop.state_init != "zero":
            raise LooplabError("generation starts Parcae's state at zero (state_init='zero'): a random start "
                               "would need a draw per token")  # fmt: skip
        self.loop = loop
        config = loop.config
        self.cfg = DecodingShape(
            n_heads=max(config.num_attention_heads, config.core_heads),
            kv_heads=max(config.num_key_value_heads, config.core_heads),
            d_model=max(config.n_embd, config.recurrent_embedding_dimension),
            head_dim=config.head_dim,
            coda_layers=len(loop.coda),
            max_len=config.block_size,
            init_state="zero",
        )
        self.positions, self.head, self.final_norm, self.core_out_norm = None, loop.lm_head, loop.ln_f, None
        self.prelude, self.core, self.coda = list(loop.prelude), list(loop.core), list(loop.coda)

    def embedding(self, tokens: Tensor) -> Tensor:
        return tokens  # the prelude pass embeds them, beside their value embeddings

    def initial_state(self, e: Tensor) -> Tensor:
        return e.new_zeros(*e.shape[:-1], self.loop.config.recurrent_embedding_dimension)

    def core_input(self, h: Tensor, e: Tensor) -> Tensor:
        return self.loop.injection(h, e)

    def prelude_pass(self, tokens: Tensor, calls) -> Tensor:
        """e [R, m, d] of the new tokens' ids [R, m], which it keeps for the later passes of these slots."""
        self._tokens(calls)[calls.rows, calls.chunk] = tokens[..., None]
        x = self.loop.embed_tokens(tokens)
        for index, block in enumerate(self.prelude):
            x = self._layer(calls, "prelude", index, block, x, tokens)
        return x if self.loop.ln_prelude is None else self.loop.ln_prelude(x)

    def core_pass(self, h: Tensor, e: Tensor, calls) -> Tensor:
        tokens = self._tokens(calls)[calls.rows, calls.chunk, 0]
        x = self.core_input(h, e)
        for index, block in enumerate(self.core):
            x = self._layer(calls, "core", index, block, x, tokens)
        return x

    def coda_pass(self, h: Tensor, calls) -> Tensor:
        """C, then the coda blocks through their cache (the logits apply ln_f)."""
        tokens = self._tokens(calls)[calls.rows, calls.chunk, 0]
        x = self.loop.C(h)
        for index, block in enumerate(self.coda):
            x = self._layer(calls, "coda", index, block, x, tokens)
        return x

    def logits(self, h: Tensor) -> Tensor:
        return self.loop.logits(self.loop.ln_f(h))

    def rope_tables(self, length: int, device, dtype) -> tuple[Tensor, Tensor]:
        cos, sin = rope_tables(self.loop.config, length, device)
        return cos.to(dtype), sin.to(dtype)

    def forward(self, tokens: Tensor, valid: Tensor, loops: int) -> Tensor:
        """Logits [B, T, V] recomputed whole (the uncached reference)."""
        return self.loop(tokens, valid.long(), loops)

    @staticmethod
    def _tokens(calls) -> Tensor:
        """[B, S, 1] long: the token id in each slot, as the prelude pass stored it."""
        site, loop, name = TOKEN_STORE
        return calls.decoder.cache.history(site, loop, name, 1, torch.long).values

    def _layer(self, calls, site: str, index: int, block: ParcaeBlock, x: Tensor, tokens: Tensor) -> Tensor:
        """Block call ``index`` of ``site`` on new tokens x [R, m, width] through its cache entry (shaped by the
        block's own key/value heads: the core's may differ from the prelude's), with its value embedding."""
        attn = block.attn
        calls.entry(index, attn.kv_heads, attn.head_dim)  # created in this block's shape before the call reads it
        ve = self.loop.value_embedding(site, index, tokens)
        if ve is None:
            return calls.layer(index, block, x)
        view = SimpleNamespace(
            attn=SimpleNamespace(project_heads=partial(attn.project_heads, ve=ve), merge_heads=attn.merge_heads,
                                 scaling=attn.scaling),
            attn_residual=block.attn_residual, mlp_residual=block.mlp_residual, mlp=block.mlp,
        )  # fmt: skip
        return calls.layer(index, view, x)


FAMILY = ModelFamily(
    name="Parcae",
    model_types={"parcae": None},
    adapter=ParcaeLoop,
    view=ParcaeDecoding,
    native_loops=lambda config: config.mean_recurrence,
    one_loop="the diagonal injection of the prelude's output, then the core blocks",
    core_layers=lambda config: config.n_layers_in_recurrent_block,
    state_width=lambda config: config.recurrent_embedding_dimension,
    config_reader=ParcaeConfig.from_dict,
    model=ParcaeForCausalLM,
    config_class_names=("ParcaeConfig",),
)
