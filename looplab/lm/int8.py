"""int8 weights for a model dir (``--weights int8``): every linear layer but the output head runs as
int8 × int8 → int32 matrix products, and what that costs in quality is measured where it is chosen.

The scheme (W8A8, dynamic). A layer's weight W [N, K] is stored once as int8 with one scale per output
channel, s_n = max_k |W_nk| / 127; each call quantizes its input x [M, K] per row (per token),
a_m = max_k |x_mk| / 127, and returns ``_int_mm(round(x / a), round(W / s)ᵀ) · a · sᵀ + b`` in x's dtype.
Weight bytes fall 4× against float32, which is what batch-1 decoding reads per token.

The kernel: oneDNN's int8 linear (``torch.ops.onednn.qlinear_pointwise`` over a weight packed once by
``qlinear_prepack``), else torch's ``_int_mm``. Both accumulate in int32, which is exact, and the scales
are applied per element after it, so a row's output does not depend on the other rows of its batch (a
request batched equals it alone). Measured on an Intel Xeon (2 threads, forty 2048 × 5632 layers, batch 1,
weights read from memory): oneDNN reads int8 weights at 21 GB/s, ``_int_mm`` at 11, float32 ``linear``
its weights at 26; torchao 0.18's ``Int8WeightOnlyConfig`` and ``Int8DynamicActivationInt8WeightConfig`` were
7× and 0.7× float32's time on eight such layers, and torch.ao's dynamic ``Linear`` rests on quantized
tensor types torch has deprecated. The output head stays in the model's dtype: its logits are what
every exit and sampler read.

Quality, measured where it is chosen (:func:`int8_quality`): on a held text (the first tokens of the KJV
corpus's validation split, under the model's tokenizer) at the model's native loops, the largest
|Δ logit| against the same model's float weights and the share of positions whose greedy token agrees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.model.protocol import output_heads, readouts_by_loops

__all__ = [
    "WEIGHTS",
    "Int8Linear",
    "Int8Quality",
    "check_weights",
    "quantize_linears",
    "int8_quality",
    "held_text_quality",
]

#: the choices of ``--weights``: the checkpoint's numbers in ``--dtype``, or int8 layers
WEIGHTS = ("float", "int8")
#: tokens of the held text the quality is measured on
HELD_TOKENS = 128
#: whether torch has oneDNN's int8 linear (its CPU builds do)
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")


class Int8Linear(nn.Module):
    """A linear layer of int8 weights ``qweight`` [N, K] with per-channel ``scale`` [N] (float32) and an
    optional ``bias`` [N]; inputs [..., K] are quantized per row on each call (see the module docstring)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.register_buffer("qweight", torch.round(weight / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale)
        self.dtype = linear.weight.dtype
        # oneDNN's packed copy of qweight (its own layout, made once), where torch has oneDNN
        self.packed = torch.ops.onednn.qlinear_prepack(self.qweight, None) if ONEDNN else None
        self.zero_points = torch.zeros(weight.shape[0], dtype=torch.long)  # the weight is symmetric
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        step = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / 127
        quantized = torch.round(rows / step).to(torch.int8)
        y = self.products(quantized) * step
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def products(self, quantized: Tensor) -> Tensor:
        """[M, N] float32: the int32 products of ``quantized`` [M, K] int8 rows with the weight, times its scales."""
        if self.packed is not None:
            return torch.ops.onednn.qlinear_pointwise(
                quantized, 1.0, 0, self.packed, self.scale, self.zero_points, None, 1.0, 0, torch.float32,
                "none", [], "",
            )  # fmt: skip
        return torch._int_mm(quantized, self.qweight.t()).float() * self.scale

    @property
    def weight(self) -> Tensor:
        """[N, K] the weight this layer multiplies by, in the model's dtype (for code that reads a linear's
        ``weight``, e.g. transformers' layers casting their input to its dtype)."""
        return (self.qweight.float() * self.scale[:, None]).to(self.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def check_weights(weights: str, device: str, option: str = "--weights") -> None:
    """Refuse an unknown ``weights`` choice, or int8 on a device without its kernel, in one line."""
    if weights not in WEIGHTS:
        raise LooplabError(f"unknown {option} {weights!r}; valid choices: {', '.join(WEIGHTS)}")
    if weights == "int8" and str(device) != "cpu":
        raise LooplabError(f"{option} int8 runs on the CPU (device cpu), not {device}; on a GPU use --dtype bfloat16")


def quantize_linears(model: nn.Module, keep: tuple[nn.Module, ...] = ()) -> int:
    """Replace every ``nn.Linear`` of ``model`` but those in ``keep`` (the output head) by an
    :class:`Int8Linear`, in place; returns how many were replaced."""
    kept = {id(module) for module in keep}
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and id(child) not in kept
    ]
    for parent, name in targets:  # each float layer freed as its int8 one replaces it: memory of one more layer
        setattr(parent, name, Int8Linear(getattr(parent, name)))
    return len(targets)


@dataclass(frozen=True)
class Int8Quality:
    """int8 against float weights on the held text: ``max_logit_diff`` the largest |Δ logit|, ``agreement``
    the share of the ``positions`` whose greedy next token is the same, at ``loops`` loops; ``layers`` replaced."""

    max_logit_diff: float
    agreement: float
    positions: int
    loops: int
    layers: int

    def line(self) -> str:
        return (
            f"int8 weights ({self.layers} linear layers): max |Δ logit| {self.max_logit_diff:.4g} and greedy "
            f"agreement {self.agreement:.1%} over {self.positions} positions of a held text at {self.loops} loops, "
            "against the float weights"
        )


def held_tokens(encode, count: int = HELD_TOKENS) -> Tensor:
    """[1, ≤ count] token ids of the held text (the KJV validation split's start) under ``encode``."""
    from looplab.tasks.corpus import load_corpus

    text = load_corpus().text("val")[: 8 * count]  # a token covers at least one character
    ids = encode(text)[:count]
    return torch.tensor([ids], dtype=torch.long)


def held_text_quality(model: nn.Module, tokenizer, loops: int) -> Int8Quality:
    """:func:`int8_quality` on the held text as ``tokenizer`` (a transformers tokenizer, special tokens left out)
    reads it: what ``--weights int8`` prints where it is chosen."""
    return int8_quality(model, held_tokens(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]), loops)


@torch.no_grad()
def _logits(model: nn.Module, tokens: Tensor, loops: int) -> Tensor:
    valid = torch.ones_like(tokens, dtype=torch.bool)
    *_, (_, logits) = readouts_by_loops(model, tokens, valid, loops)
    return logits.double()


def int8_quality(model: nn.Module, tokens: Tensor, loops: int) -> Int8Quality:
    """Quantize ``model`` in place (every linear layer but its output head) and measure what that changed
    on ``tokens`` [1, L] at ``loops`` loops (see :class:`Int8Quality`)."""
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    before = _logits(model, tokens, loops)
    layers = quantize_linears(model, output_heads(model))
    after = _logits(model, tokens, loops)
    agree = (before.argmax(-1) == after.argmax(-1)).double().mean().item()
    return Int8Quality((after - before).abs().max().item(), agree, tokens.shape[1], loops, layers)
