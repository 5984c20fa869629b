"""Parcae's modules under the reference's parameter names (the family is :mod:`looplab.lm.parcae`): the
attention with its gated value embedding, the MLP, the pre-norm block, the three injections and the causal LM
(``transformer.*``, ``value_embeds.*``, ``lm_head``) a published checkpoint loads into key for key.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.lm.huginn import RMSNorm
from looplab.lm.parcae_config import VE_GATE_CHANNELS, ParcaeConfig
from looplab.model.attention import apply_rope

__all__ = ["ParcaeForCausalLM", "INJECTIONS"]


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
