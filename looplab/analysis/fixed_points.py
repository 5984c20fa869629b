"""Convergence and fixed points of the core layers' states across loops (docs/methods.md §7).

Inputs are the core states X_{ℓ,t} of a trace, ``states`` [loops, layers, B, T, d]
(:meth:`Trace.states`), and optionally the validity mask ``valid`` [B, T]; padded
tokens are zeroed before any norm or inner product, so they never count.

    convergence        Δ_{ℓ,t} = ‖X_{ℓ,t} − X_{ℓ,t−1}‖_F / ‖X_{ℓ,t}‖_F     (per sample, over T×d)
    cosine             cos(X, Y) = ⟨vec X, vec Y⟩ / (‖X‖_F ‖Y‖_F)          (per sample, then batch mean)
    layer_cosines      C_{ℓℓ′} = cos(X_{ℓ,r}, X_{ℓ′,r}) at the last loop r   → distinct fixed points
    self_convergence   S_{ℓ,t} = cos(X_{ℓ,t}, X_{ℓ,r})                      → approach to the own fixed point

The two numbers of the paper's norm-ablation table (``looplab/data/paper_tables/mechanistic_norm_ablation.csv``):

    fixed_point_self_cos      min_{t ∈ last W loops before r} S_{0,t}    (first core layer; W = max(1, r // 4))
    fixed_point_cross_cos_min min_{ℓ′ ≠ 0} C_{0ℓ′}                       (first core layer vs the others)

Beside them, two that say why a row came out as it did:

    fixed_point_self_cos_median  the same minimum per sample, then the median over samples
                                 (one oscillating sequence cannot hide the rest, nor drag the mean)
    update_ratios                U_ℓ = ‖X_{ℓ,r} − X_{ℓ−1,r}‖_F / ‖X_{ℓ−1,r}‖_F, ℓ = 1..k−1 (batch mean):
                                 how far one layer moves the stream; cross-layer cosines track it
    state_norms                  per-token ‖h_t‖ over valid tokens, per loop

The paper's 1.000 for the first means "the first layer sits on its fixed point over the
late loops"; a slow oscillation or drift pulls the minimum over the window below 1, which a
single consecutive-loop cosine would hide. With injection the second is < 0.65 (distinct
fixed points); without injection pre-norm layers collapse to one state (≈ 1).
"""

from __future__ import annotations

from torch import Tensor

__all__ = [
    "convergence",
    "cosine",
    "layer_cosines",
    "self_convergence",
    "fixed_point_self_cos",
    "fixed_point_self_cos_median",
    "late_self_cos",
    "fixed_point_cross_cos_min",
    "update_ratios",
    "state_norms",
]

EPS = 1e-12


def _masked(x: Tensor, valid: Tensor | None) -> Tensor:
    """x [..., B, T, d] with padded tokens zeroed, flattened to [..., B, T·d]."""
    if valid is not None:
        x = x * valid.to(device=x.device, dtype=x.dtype)[..., None]
    return x.flatten(-2)


def convergence(states: Tensor, valid: Tensor | None = None, per_sample: bool = False) -> Tensor:
    """Δ_{ℓ,t} for t = 2..loops: [layers, loops − 1] (batch mean) or [layers, loops − 1, B]."""
    flat = _masked(states.double(), valid)
    delta = (flat[1:] - flat[:-1]).norm(dim=-1) / flat[1:].norm(dim=-1).clamp_min(EPS)  # [loops-1, layers, B]
    delta = delta.transpose(0, 1)
    return (delta if per_sample else delta.mean(-1)).to(states.dtype)


def cosine(x: Tensor, y: Tensor, valid: Tensor | None = None) -> Tensor:
    """cos(x, y) per sample for x, y [..., B, T, d]: [..., B]."""
    fx, fy = _masked(x.double(), valid), _masked(y.double(), valid)
    return (fx * fy).sum(-1) / (fx.norm(dim=-1) * fy.norm(dim=-1)).clamp_min(EPS)


def layer_cosines(states: Tensor, valid: Tensor | None = None) -> Tensor:
    """C_{ℓℓ′} = batch mean of cos(X_{ℓ,r}, X_{ℓ′,r}) at the last loop r: [layers, layers]."""
    final = states[-1]  # [layers, B, T, d]
    cos = cosine(final[:, None], final[None, :], valid)  # [layers, layers, B]
    return cos.mean(-1).to(states.dtype)


def self_convergence(states: Tensor, valid: Tensor | None = None, per_sample: bool = False) -> Tensor:
    """S_{ℓ,t} = batch mean of cos(X_{ℓ,t}, X_{ℓ,r}): [layers, loops] (the last column is 1),
    or per sample [layers, loops, B]."""
    cos = cosine(states, states[-1:].expand_as(states), valid).transpose(0, 1)  # [layers, loops, B]
    return (cos if per_sample else cos.mean(-1)).to(states.dtype)


def _late_window(loops: int, window: int | None) -> int:
    return min(window or max(1, loops // 4), loops - 1)


def late_self_cos(curves: Tensor, window: int | None = None) -> tuple[float, float]:
    """From one layer's per-sample S_{ℓ,t}, curves [loops, B]: (min over the last W loops before r
    of the batch-mean curve, median over samples of each sample's own such minimum); (1, 1) for one loop."""
    loops = curves.shape[0]
    if loops < 2:
        return 1.0, 1.0
    late = slice(-1 - _late_window(loops, window), -1)
    return float(curves.mean(-1)[late].min()), float(curves[late].min(dim=0).values.median())


def fixed_point_self_cos(
    states: Tensor, valid: Tensor | None = None, window: int | None = None, layer: int = 0
) -> float:
    """min over the last W loops before r of S_{layer,t} (W = max(1, loops // 4)); 1.0 for a single loop."""
    return late_self_cos(self_convergence(states, valid, per_sample=True)[layer], window)[0]


def fixed_point_self_cos_median(
    states: Tensor, valid: Tensor | None = None, window: int | None = None, layer: int = 0
) -> float:
    """Median over samples of each sample's min over the last W loops before r of its own S_{layer,t}."""
    return late_self_cos(self_convergence(states, valid, per_sample=True)[layer], window)[1]


def update_ratios(states: Tensor, valid: Tensor | None = None) -> Tensor:
    """U_ℓ = batch mean of ‖X_{ℓ,r} − X_{ℓ−1,r}‖_F / ‖X_{ℓ−1,r}‖_F at the last loop: [layers − 1]."""
    flat = _masked(states[-1].double(), valid)  # [layers, B, T·d]
    ratio = (flat[1:] - flat[:-1]).norm(dim=-1) / flat[:-1].norm(dim=-1).clamp_min(EPS)
    return ratio.mean(-1).to(states.dtype)


def state_norms(loop_states: Tensor, valid: Tensor | None = None) -> Tensor:
    """Mean per-token ‖h_t‖ over valid tokens for loop states [loops, B, T, d]: [loops]."""
    norms = loop_states.double().norm(dim=-1)  # [loops, B, T]
    if valid is None:
        return norms.flatten(1).mean(-1).to(loop_states.dtype)
    mask = valid.to(device=norms.device, dtype=norms.dtype)
    return ((norms * mask).flatten(1).sum(-1) / mask.sum().clamp_min(1)).to(loop_states.dtype)


def fixed_point_cross_cos_min(states: Tensor, valid: Tensor | None = None, layer: int = 0) -> float:
    """min over ℓ′ ≠ layer of C_{layer,ℓ′}; NaN when there is only one core layer."""
    matrix = layer_cosines(states, valid)
    others = [j for j in range(matrix.shape[0]) if j != layer]
    if not others:
        return float("nan")
    return float(matrix[layer, others].min())
