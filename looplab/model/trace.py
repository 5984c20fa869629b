"""Trace of one forward pass of a looped model, with a stable name per (loop, layer).

TransformerLens caches activations by hook name and overwrites an entry when a
hook fires twice; a looped model runs every core layer once per loop, so here
each name carries the loop. :func:`trace` drives the model's own methods
(``start``, ``step`` r times, ``readout``) and records through its layer hook
(``observe``) and its attention watch (``watch_attention``), so it records what
the model computes, for any model of the looped-model protocol
(``looplab.model.protocol``): a looplab model or a retrofitted pretrained one:

    x = e (+ positions) → prelude₀ … prelude_{p−1} → e
    h_0 = initial_state(e)
    for t = 1..r:  x = inject(h_{t−1}, e);  x = core_ℓ(x) for ℓ = 0..k−1;  h_t = core_out_norm(x)
    coda₀ … coda_{c−1} applied to h_r

Names (``TT`` is the loop t zero-padded to ``max(2, digits(loops))`` digits,
loop 1 is the first application of the core, loop 0 the initial state):

    preludeI.resid     [B, T, d]     output of prelude layer I
    preludeI.attn      [B, H, T, T]  its attention probabilities (attention=True)
    loopTT.coreL.resid [B, T, d]     X_{L,t}: residual state after core layer L in loop t
    loopTT.coreL.attn  [B, H, T, T]  A_{L,t}: attention probabilities of core layer L in loop t
    loopTT.coreL.attn_in [B, T, d]   the input of core layer L's attention in loop t (after
                                     the attention norm for pre-norm/sandwich placements)
    loopTT.state       [B, T, d]     h_t (after core_out_norm); loop00.state is h_0
    middleI.resid / middleI.attn     a retrofit's kept middle layer I, after the loop
    codaI.resid / codaI.attn         coda layer I, run on the last loop's state

Only the selected core layers and loops are kept; everything is detached and
moved to the chosen device and dtype as it is produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.model.protocol import LoopedModel

__all__ = ["Trace", "trace", "loop_name"]


def loop_name(t: int, loops: int) -> str:
    """``loopTT`` for loop t of a trace with ``loops`` loops (zero-padded so names sort by t)."""
    return f"loop{t:0{max(2, len(str(loops)))}d}"


@dataclass
class Trace:
    """Recorded activations of one forward pass.

    Attributes:
        cache: name → tensor (see the module docstring for the names and shapes).
        valid: [B, T] bool validity mask of the traced batch.
        loops: the recorded loop indices t (1-based, increasing).
        layers: the recorded core layer indices ℓ (increasing).
        total_loops: r, how many loops were run.
        n_prelude, n_coda: prelude and coda layer counts of the model.
        has_attention: whether attention probabilities were recorded.
    """

    cache: dict[str, Tensor] = field(default_factory=dict)
    valid: Tensor | None = None
    loops: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    total_loops: int = 0
    n_prelude: int = 0
    n_coda: int = 0
    has_attention: bool = False
    _stacked: dict[str, Tensor] = field(default_factory=dict, repr=False)

    def names(self) -> list[str]:
        """Every recorded name, in recording order."""
        return list(self.cache)

    def __getitem__(self, name: str) -> Tensor:
        return self.cache[name]

    def __contains__(self, name: str) -> bool:
        return name in self.cache

    def name(self, t: int, layer: int | None = None, kind: str = "resid") -> str:
        """The name of loop t's core layer ``layer`` entry of ``kind`` (or of h_t when layer is None)."""
        prefix = loop_name(t, self.total_loops)
        return f"{prefix}.state" if layer is None else f"{prefix}.core{layer}.{kind}"

    def _stack(self, kind: str) -> Tensor:
        """The ``kind`` entries as [loops, layers, ...], stacked once (a trace is not added to after recording)."""
        if kind not in self._stacked:
            self._stacked[kind] = torch.stack(
                [torch.stack([self.cache[self.name(t, layer, kind)] for layer in self.layers]) for t in self.loops]
            )
        return self._stacked[kind]

    def states(self) -> Tensor:
        """X_{ℓ,t} of the recorded loops and core layers: [loops, layers, B, T, d]."""
        return self._stack("resid")

    def attention_inputs(self) -> Tensor:
        """Inputs of the core attention (normalised for pre-norm): [loops, layers, B, T, d]."""
        return self._stack("attn_in")

    def attention(self) -> Tensor:
        """A_{ℓ,t} of the recorded loops and core layers: [loops, layers, B, H, T, T]."""
        if not self.has_attention:
            raise ValueError("this trace was recorded without attention=True")
        return self._stack("attn")

    def loop_states(self) -> Tensor:
        """h_t of the recorded loops: [loops, B, T, d]."""
        return torch.stack([self.cache[self.name(t)] for t in self.loops])


@torch.no_grad()
def trace(
    model: LoopedModel,
    tokens: Tensor,
    valid: Tensor,
    loops: int,
    *,
    layers: list[int] | None = None,
    loop_indices: list[int] | None = None,
    attention: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
) -> Trace:
    """Run ``loops`` loops of ``model`` on tokens/valid [B, T] and record the selected activations.

    Args:
        layers: core layer indices to record (default: all).
        loop_indices: loops t ∈ 1..loops to record (default: all); loop 0 (h_0) is
            recorded when 0 is listed or when no selection is given.
        attention: also record attention probabilities (math kernel for the recorded
            calls, so they may differ from the SDPA kernel by rounding) and attention inputs.
        dtype, device: where the recorded tensors are stored.
        generator: for a noise initial state.

    Returns:
        A :class:`Trace`; its final ``loopTT.state`` equals the last state of the model's own
        unroll (bit for bit without ``attention``).
    """
    n_core = len(model.core)
    layers = sorted(set(range(n_core) if layers is None else layers))
    if any(not 0 <= layer < n_core for layer in layers):
        raise ValueError(f"core layer indices must lie in 0..{n_core - 1}, got {layers}")
    wanted = set(range(0, loops + 1) if loop_indices is None else loop_indices)
    if any(not 0 <= t <= loops for t in wanted):
        raise ValueError(f"loop indices must lie in 0..{loops}")
    run_device = next(model.parameters()).device
    tokens, valid = tokens.to(run_device), valid.to(run_device)
    out = Trace(
        valid=valid.detach().to(device),
        loops=sorted(t for t in wanted if t >= 1),
        layers=layers,
        total_loops=loops,
        n_prelude=len(model.prelude),
        n_coda=len(model.coda),
        has_attention=attention,
    )

    def keep(name: str, value: Tensor) -> None:
        out.cache[name] = value.detach().to(device=device, dtype=dtype)

    loop = 0  # the loop the model is running, 0 before the first (prelude) and after the last (coda)

    def record(site: str, index: int, layer, x: Tensor, run) -> Tensor:
        if site != "core":
            prefix = f"{site}{index}"
        elif loop in wanted and index in layers:
            prefix = f"{loop_name(loop, loops)}.core{index}"
        else:
            return run(x)
        if not attention:
            x = run(x)
            keep(f"{prefix}.resid", x)
            return x
        with model.watch_attention(layer) as seen:
            x = run(x)
        if not seen.probs:
            raise LooplabError(f"{prefix}: the attention returned no probabilities (it needs eager attention)")
        keep(f"{prefix}.resid", x)
        keep(f"{prefix}.attn", seen.probs[-1])
        keep(f"{prefix}.attn_in", seen.inputs[-1])
        return x

    with model.observe(record):
        h, e, ctx = model.start(tokens, valid, generator)
        if 0 in wanted:
            keep(f"{loop_name(0, loops)}.state", h)
        for loop in range(1, loops + 1):
            h = model.step(h, e, ctx)
            if loop in wanted:
                keep(f"{loop_name(loop, loops)}.state", h)
        loop = 0
        if len(model.coda):
            model.readout(h, ctx)
    return out
