"""How much compute a tool on a model dir spends, how its defaults keep a large model's run short, and how
long it will take on this machine — said before the work starts.

The unit is a forward pass of one loop over one window: 2 × P × W FLOPs for a model of P parameters and a
window of W tokens (every parameter counted, the embedding's included: an upper bound of the loop's
matmuls that needs no per-family accounting). A forward-mode Jacobian–vector product is counted as
:data:`JVP_PASSES` such passes. A tool's default windows (``--samples``) are the usual count, or fewer when
that much work would pass :data:`DEFAULT_FLOPS` — so on a small model the defaults are the usual ones and
on a published-size one they finish in minutes — and always at least one. The estimate of the time divides
the FLOPs by a rate measured here (a matrix product of the model's dtype over a window's rows) and allows
for the work beside the matmuls (:data:`OTHER_WORK`): rough, and the progress lines' ETA follows the real rate.
"""

from __future__ import annotations

import functools
import time

import torch

from looplab.progress import duration

__all__ = ["DEFAULT_FLOPS", "JVP_PASSES", "budgeted_windows", "estimate_line", "pass_flops"]

#: the FLOPs a tool's default windows spend at most: 6–8 minutes of an Intel Xeon's 2 cores in float32 (a
#: loop of the Ouro-1.4B shape runs at 200–280 GFLOP/s there: docs/testing.md)
DEFAULT_FLOPS = 1.0e14
#: a forward-mode JVP of a loop, in forward passes of it (the primal and the tangent with its own matmuls;
#: measured 3.6–4.1 on the Ouro-1.4B shape)
JVP_PASSES = 4
#: a tool's wall time over its matmuls' at the measured rate: loading, attention, norms, the analysis's own
#: reductions (measured 1.4–1.6 for analyze spectral and mechanistic on the Ouro-1.4B shape)
OTHER_WORK = 1.5


def pass_flops(parameters: int, window: int) -> float:
    """FLOPs of one loop's forward over one window of ``window`` tokens (module docstring)."""
    return 2.0 * parameters * window


def budgeted_windows(parameters: int, window: int, passes_per_window: float, usual: int) -> int:
    """The default windows: ``usual``, or as many as :data:`DEFAULT_FLOPS` allows when each window costs
    ``passes_per_window`` loop passes; at least one."""
    each = pass_flops(parameters, window) * passes_per_window
    return max(1, min(usual, int(DEFAULT_FLOPS // each)))


@functools.cache
def _rate(dtype: torch.dtype, device: str, rows: int) -> float:
    """FLOP/s of a ``rows`` × 2048 by 2048 × 2048 matrix product in ``dtype`` on ``device``, the best of five (a
    window's tokens through a layer's weight: on the Ouro-1.4B shape within 10 % of a loop's measured rate)."""
    a = torch.randn(rows, 2048, device=device).to(dtype)
    b = torch.randn(2048, 2048, device=device).to(dtype)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - start)
    return 2 * rows * 2048 * 2048 / best


def estimate_line(flops: float, dtype: torch.dtype, device: str, window: int) -> str:
    """``about 4 min 10 s here (12.5 TFLOP at 250 GFLOP/s measured)``: the time ``flops`` takes at this
    machine's rate for a matrix product over windows of ``window`` tokens, times :data:`OTHER_WORK`."""
    rate = _rate(dtype, str(device), max(1, min(window, 1024)))
    seconds = OTHER_WORK * flops / rate
    return f"about {duration(seconds)} here ({flops / 1e12:,.1f} TFLOP at {rate / 1e9:,.0f} GFLOP/s measured)"
