"""Parcae's config (the family is :mod:`looplab.lm.parcae`): the reference's config dataclass saved whole as
``config.json`` (``_class_name`` ``ParcaeConfig``, no ``model_type``), read and checked field by field
(:data:`PARCAE_FIELDS`), and where its value embeddings sit.

Value embeddings: a table ``value_embeds.{i}`` [V, kv width] for each i in 0..P+R+C−1 of the parity of
P+R+C−1, and a gate ``attn.ve_gate`` (Linear(32, kv heads)) in each block whose *layer id* has the parity of
n_layer − 1, n_layer = R · mean_backprop_depth. Block j of the prelude, core and coda has layer id j, P + j
and P + R·N + j (N = mean_recurrence) but reads table j, P + j and P + R + j; where both exist,
v += 2σ(ve_gate(x[..., :32])) ⊙ value_embeds(tokens). Where only one exists the reference computes nothing
from it, and neither does looplab (:meth:`ParcaeConfig.value_table`): with R·(N − 1) odd (R = 1, N = 8, say)
the coda's tables and gates sit at opposite parities and only some of them meet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from looplab.errors import LooplabError
from looplab.lm.config_fields import boolean, check_fields, integer, one_of, positive_number
from looplab.token_exits import MAX_LOOPS

__all__ = ["PARCAE_FIELDS", "ParcaeConfig"]

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
