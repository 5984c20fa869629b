"""Up-front memory estimates: a size that cannot fit is refused before anything is written or allocated.

The estimates are deliberately rough upper bounds (fp32 everywhere, every layer
application of the deepest possible unroll kept for backward, attention
probabilities stored as the math path does); they exist to turn "d_model = 10⁶"
or "batch_size = 10⁹" into one line naming the size, instead of an allocator
error minutes later. A config that fits comfortably is never refused.
"""

from __future__ import annotations

import os

import torch

from looplab.config import Config
from looplab.errors import LooplabError
from looplab.tasks import Task

__all__ = [
    "parameter_count",
    "training_bytes",
    "eval_bytes",
    "trace_bytes",
    "recorded_trace_bytes",
    "probe_bytes",
    "lm_eval_bytes",
    "device_bytes",
    "check_fits",
]

FLOAT = 4
GIB = 1024**3
#: what one row of a per-loop table costs before it becomes a DataFrame (a dict of a few Python floats)
ROW_BYTES = 512


def parameter_count(config: Config, vocab_size: int) -> int:
    """Weights of the looped model the config describes (norm parameters ignored)."""
    m = config.model
    d = m.d_model
    per_layer = 4 * d * d + 2 * m.mlp_ratio * d * d
    layers = m.prelude_layers + m.core_layers + m.coda_layers
    extra = {"concat": 2 * d * d, "contractive": d * d + 2 * d}.get(m.injection, 0)
    positions = m.max_len * d if m.positional == "learned" else 0
    return layers * per_layer + 2 * vocab_size * d + extra + positions


def _per_token(config: Config, length: int) -> int:
    """Floats one layer application keeps per token: activations and attention probabilities."""
    m = config.model
    return (10 + 2 * m.mlp_ratio) * m.d_model + m.n_heads * length


def training_bytes(config: Config, task: Task, depth: int) -> int:
    """Weights, gradients and AdamW moments, plus the activations of the deepest training unroll (``depth``
    loops: the schedule's T_train) that backward keeps: with ``train.backprop_loops`` = g, g loops per
    deep-supervision segment (or g in all without segments)."""
    length = task.seq_len(config.task.train_max)
    m, train = config.model, config.train
    kept = depth
    if train.backprop_loops:
        segments = -(-depth // train.segment_loops) if train.segment_loops else 1
        kept = min(depth, train.backprop_loops * segments)
    core_per_loop = m.latent_steps + 1 if m.recurrence == "trm" else 1  # TRM runs the core n + 1 times a loop
    applications = m.prelude_layers + m.coda_layers + m.core_layers * core_per_loop * kept
    activations = config.train.batch_size * length * applications * _per_token(config, length)
    return FLOAT * (4 * parameter_count(config, task.vocab_size) + activations)


def eval_bytes(config: Config, task: Task, lengths: list[int], max_loops: int, samples: int) -> int:
    """Weights, one evaluation batch's unroll state and logits, and the per-sample outcomes of every length."""
    length = max(task.seq_len(n) for n in lengths)
    batch = min(config.eval.batch_size, samples)
    unroll = batch * length * (_per_token(config, length) + task.vocab_size)
    outcomes = 6 * samples * max_loops * len(lengths)  # correct, flips, confidence, norms per (sample, K)
    return FLOAT * (parameter_count(config, task.vocab_size) + unroll + outcomes)


def trace_bytes(config: Config, task: Task, samples: int, loops: int, attention: bool) -> int:
    """An analysis trace of ``samples`` instances at the longest training length over ``loops`` loops: every
    core layer's output (with ``attention``: its attention input and probabilities too) and every state."""
    m = config.model
    length = task.seq_len(config.task.train_max)
    state_width = m.d_model * (2 if m.recurrence == "trm" else 1)
    recorded = recorded_trace_bytes(samples, length, loops, m.core_layers, m.d_model, m.n_heads, state_width, attention)
    return recorded + FLOAT * parameter_count(config, task.vocab_size)


def recorded_trace_bytes(
    samples: int, length: int, loops: int, core_layers: int, width: int, heads: int, state_width: int, attention: bool
) -> int:
    """What a trace stores (float32) for ``samples`` rows of ``length`` tokens over ``loops`` loops: each core
    layer's output of ``width`` per token (with ``attention``: its attention input and ``heads`` probability
    maps too) and each loop's state of ``state_width`` per token — for any model of the protocol."""
    rows = samples * length
    per_call = rows * width * (2 if attention else 1) + (samples * heads * length * length if attention else 0)
    return FLOAT * (loops + 1) * (core_layers * per_call + rows * state_width)


def probe_bytes(config: Config, task: Task, length: int, samples: int, loops: int, kept: int, rows: int) -> int:
    """A probe of ``samples`` instances of size ``length`` over ``loops`` loops (``looplab analyze spectral`` and
    ``pca``): one loop's layer applications with their tangents, ``kept`` floats kept per loop (a state) and
    ``rows`` table rows per loop."""
    m = config.model
    width = task.seq_len(length)
    one_loop = 2 * samples * width * (m.core_layers + 1) * _per_token(config, width)  # forward and tangent
    return FLOAT * (parameter_count(config, task.vocab_size) + one_loop + loops * kept) + ROW_BYTES * rows * loops


def lm_eval_bytes(config: Config, task: Task, window: int, samples: int, max_loops: int, batch_size: int) -> int:
    """A loss-against-loops evaluation: one batch of ``window``-byte windows read out at a loop, and a row per loop."""
    width = task.seq_len(window)
    batch = min(batch_size, samples)
    unroll = batch * width * (_per_token(config, width) + task.vocab_size)
    return FLOAT * (parameter_count(config, task.vocab_size) + unroll) + ROW_BYTES * max_loops


def device_bytes(device: str) -> int:
    """Memory of the device: the machine's RAM for ``cpu``, the GPU's for ``cuda[:N]``."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return torch.cuda.get_device_properties(index).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(what: str, needed: int, device: str, advice: str) -> None:
    """Refuse ``what`` when its estimate exceeds the device's memory."""
    available = device_bytes(device)
    if needed > available:
        raise LooplabError(
            f"{what} needs an estimated {needed / GIB:,.1f} GiB, more than the "
            f"{available / GIB:,.1f} GiB of {device}; {advice}"
        )
