"""ColSum concentration: how much of a layer's attention lands on one token (docs/methods.md §7).

For attention probabilities A [.., T, T] (rows = queries, columns = keys) and the
set V of valid positions of a sample (n = |V|):

    c_j = (1/n) Σ_{i ∈ V} A_ij                  (column mass; Σ_j c_j = 1)
    C   = 1 + (1/log n) Σ_j c_j log c_j          (0 log 0 = 0)

C = 1 when every query puts all its mass on one key (the attention sink) and
C = 0 when every column gets the same mass (uniform attention over the valid
keys). Masked keys carry no probability, so they add nothing. With n = 1 there
is only one key, all mass is on it, and C = 1.

Over *effective depth* (prelude layers, then loop × core layers, then coda)
the curve shows the stages of inference repeating once per loop.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.model.trace import Trace

__all__ = ["colsum_concentration", "colsum_trace", "colsum_depth"]


def colsum_concentration(probs: Tensor, valid: Tensor | None = None) -> Tensor:
    """C per sample and head for probs [..., B, H, T, T] and valid [B, T]: [..., B, H]."""
    probs = probs.double()
    length = probs.shape[-1]
    if valid is None:
        valid = torch.ones(probs.shape[-4], length, dtype=torch.bool, device=probs.device)
    rows = valid.to(probs.device, torch.double)[:, None, :, None]  # [B, 1, T, 1]: valid queries
    count = rows.sum(-2).clamp_min(1.0)  # [B, 1, 1]
    column = (probs * rows).sum(-2) / count  # [..., B, H, T]
    plogp = torch.where(column > 0, column * column.clamp_min(1e-300).log(), torch.zeros_like(column))
    log_n = count[..., 0].log()  # [B, 1]
    # Mathematically in [0, 1]; the clamp only removes rounding from float32 probabilities.
    concentration = (1.0 + plogp.sum(-1) / log_n.clamp_min(1e-300)).clamp(0.0, 1.0)
    return torch.where(log_n > 0, concentration, torch.ones_like(concentration))


def colsum_trace(recorded: Trace) -> Tensor:
    """C of every recorded core layer and loop, batch mean: [loops, layers, H]."""
    return colsum_concentration(recorded.attention(), recorded.valid).mean(-2).float()


def colsum_depth(recorded: Trace, core: Tensor | None = None) -> tuple[Tensor, list[str]]:
    """C over effective depth, batch mean: ([depth, H], labels).

    Depth runs over prelude layers, then every recorded (loop, core layer) in order,
    then coda layers; labels are the trace names without the ``.attn`` suffix. ``core``
    is :func:`colsum_trace` of the same trace when the caller already has it.
    """
    heads = recorded.attention().shape[-3]

    def once(names: list[str]) -> Tensor:
        values = [colsum_concentration(recorded[name], recorded.valid).mean(0).float() for name in names]
        return torch.stack(values) if values else torch.zeros(0, heads)

    prelude = [f"prelude{i}.attn" for i in range(recorded.n_prelude)]
    core_names = [recorded.name(t, layer, "attn") for t in recorded.loops for layer in recorded.layers]
    coda = [f"coda{i}.attn" for i in range(recorded.n_coda)]
    core = colsum_trace(recorded) if core is None else core  # [loops, layers, H]: one batched call
    values = torch.cat([once(prelude), core.flatten(0, 1), once(coda)])
    return values, [name.removesuffix(".attn") for name in prelude + core_names + coda]
