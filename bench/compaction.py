"""Per-sample depth by active-set compaction vs unrolling every row to the batch's max depth.

Measures one full training step (forward, backward, gradient clipping, AdamW
step) on ``binary_addition`` with mixed per-row depths: batch 64, lengths n
uniform in 1..19, ``matched`` schedule (τ = T(n) = n + 1, so τ ∈ 2..20).

- compacted: ``model.forward_at_depths(tokens, valid, depths)``; rows leave
  the batch once their depth is reached, so the work is ∝ Σᵢ τᵢ.
- naive baseline: ``model.unroll`` every row to max τ keeping all states,
  gather each row's state at its own τ, and call ``model.readout`` once;
  the work is ∝ B · max τ.

Both paths use the same loss, the mean over rows of ``per_row_loss`` (cross
entropy over the answer region). Before timing, the script asserts that for
the same weights the two paths give the same logits on valid positions and
the same gradients (max abs diff ≤ 1e-5).

The model is the library default (d_model 64, 4 heads, 2 core layers, RoPE).
The ideal speedup is B · max τ / Σᵢ τᵢ (about 1.8 for these lengths).
Goal: compacted ≥ 1.6× faster than naive.

    python bench/compaction.py [--batch 64] [--max-length 19] [--d-model 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
from collections.abc import Callable

import torch
from timing import add_common_options, add_model_options, median, print_table, print_verdict, setup, time_interleaved
from torch import Tensor

from looplab.config import Config, validate
from looplab.experiment import Experiment
from looplab.model import LoopedTransformer
from looplab.schedules.objectives import per_row_loss
from looplab.seeding import derive_generator
from looplab.tasks import TaskBatch
from looplab.train.trainer import make_optimizer

GOAL = 1.6
TOLERANCE = 1e-5


def naive_logits(model: LoopedTransformer, tokens: Tensor, valid: Tensor, depths: Tensor) -> Tensor:
    """Logits [B, L, V] at each row's depth, by unrolling every row to max(depths)."""
    states = []
    for h, ctx in model.unroll(tokens, valid, int(depths.max())):  # noqa: B007 (the last ctx reads out)
        states.append(h)
    chosen = torch.stack(states)[depths - 1, torch.arange(len(depths), device=depths.device)]
    return model.readout(chosen, ctx)


def compacted_logits(model: LoopedTransformer, tokens: Tensor, valid: Tensor, depths: Tensor) -> Tensor:
    """Logits [B, L, V] at each row's depth, by active-set compaction."""
    return model.forward_at_depths(tokens, valid, depths)


PATHS = {"naive": naive_logits, "compacted": compacted_logits}


def batch_loss(model: LoopedTransformer, logits_fn: Callable, batch: TaskBatch, depths: Tensor) -> Tensor:
    """Mean over rows of the answer-region cross-entropy at each row's depth."""
    return per_row_loss(logits_fn(model, batch.tokens, batch.valid, depths), batch.labels).mean()


def check_paths_agree(model: LoopedTransformer, batch: TaskBatch, depths: Tensor) -> tuple[float, float]:
    """Assert equal logits (valid positions) and gradients for one batch; return the two max abs diffs."""
    logits, grads = {}, {}
    for name, logits_fn in PATHS.items():
        model.zero_grad(set_to_none=True)
        out = logits_fn(model, batch.tokens, batch.valid, depths)
        per_row_loss(out, batch.labels).mean().backward()
        logits[name] = out.detach()
        grads[name] = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logit_diff = float((logits["naive"] - logits["compacted"]).abs()[batch.valid].max())
    assert grads["naive"].keys() == grads["compacted"].keys(), "the two paths touch different parameters"
    grad_diff = max(float((grads["naive"][k] - grads["compacted"][k]).abs().max()) for k in grads["naive"])
    assert logit_diff <= TOLERANCE, f"logits differ by {logit_diff:.3g} > {TOLERANCE}"
    assert grad_diff <= TOLERANCE, f"gradients differ by {grad_diff:.3g} > {TOLERANCE}"
    return logit_diff, grad_diff


def make_step(
    model: LoopedTransformer,
    optimizer: torch.optim.Optimizer,
    clip: float,
    logits_fn: Callable,
    batch: TaskBatch,
    depths: Tensor,
) -> Callable[[], None]:
    """A closure running one training step of ``model`` on ``batch`` with ``logits_fn``."""

    def step() -> None:
        loss = batch_loss(model, logits_fn, batch, depths)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    return step


def make_paths(exp: Experiment, batches: list[tuple[TaskBatch, Tensor]]) -> dict[tuple[str, int], Callable[[], None]]:
    """One step closure per (path, batch index), paths alternating; each path trains its own model copy."""
    copies = {name: copy.deepcopy(exp) for name in PATHS}
    optimizers = {name: make_optimizer(copied) for name, copied in copies.items()}
    paths = {}
    for index, (batch, depths) in enumerate(batches):
        for name, logits_fn in PATHS.items():
            paths[name, index] = make_step(
                copies[name].model, optimizers[name], exp.config.train.grad_clip, logits_fn, batch, depths
            )
    return paths


def build(args: argparse.Namespace) -> tuple[Experiment, list[tuple[TaskBatch, Tensor]]]:
    """The experiment and ``args.batches`` fixed (batch, depths) pairs drawn from the seed."""
    config = Config()
    config.task.name = "binary_addition"
    config.task.train_min, config.task.train_max = 1, args.max_length
    config.schedule.name = "matched"
    config.model.d_model, config.model.n_heads, config.model.core_layers = args.d_model, args.n_heads, args.layers
    config.train.batch_size = args.batch
    config.run.seed, config.run.device = args.seed, args.device
    validate(config)
    exp = Experiment.build(config)
    batches = []
    for index in range(args.batches):
        generator = derive_generator(args.seed, "bench", "compaction", index)
        lengths = torch.randint(1, args.max_length + 1, (args.batch,), generator=generator)
        depths = exp.schedule.train_depths(lengths, generator)
        batches.append((exp.task.sample_lengths(lengths, generator).to(args.device), depths.to(args.device)))
    return exp, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=19, help="lengths n are uniform in 1..max-length")
    add_model_options(parser)
    parser.add_argument("--batches", type=int, default=6, help="distinct fixed batches (mixes of depths)")
    add_common_options(parser, repeats=15, warmup=1)
    args = parser.parse_args()
    setup(args.threads, args.seed)

    load_before = os.getloadavg()[0]
    exp, batches = build(args)
    diffs = [check_paths_agree(exp.model, batch, depths) for batch, depths in batches]
    logit_diff, grad_diff = (max(d[i] for d in diffs) for i in range(2))
    all_depths = [depths for _, depths in batches]
    work_ratio = sum(float(d.sum()) for d in all_depths) / sum(len(d) * int(d.max()) for d in all_depths)
    seconds = time_interleaved(make_paths(exp, batches), args.repeats, args.warmup)
    # Per batch the median over repeats (robust to load spikes), then the mean over batches.
    per_step = {name: statistics.mean(median(seconds[name, b]) for b in range(args.batches)) for name in PATHS}
    spread = {
        name: [
            min(min(seconds[name, b]) for b in range(args.batches)),
            max(max(seconds[name, b]) for b in range(args.batches)),
        ]
        for name in PATHS
    }

    print(
        f"compaction: binary_addition, batch {args.batch}, n ~ U{{1..{args.max_length}}}, matched depths T(n) = n + 1, "
        f"d_model {args.d_model}, {args.layers} core layers, {args.threads} threads"
    )
    print(
        f"timing: {args.batches} fixed batches, {args.warmup} warm-up + {args.repeats} timed steps per (path, batch), "
        f"interleaved; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        f"check: max |logit diff| {logit_diff:.2e}, max |grad diff| {grad_diff:.2e} over {args.batches} batches "
        f"(tolerance {TOLERANCE:g}) -> OK"
    )
    print(f"work: sum(tau) / (B * max tau) = {work_ratio:.3f}  (ideal speedup {1 / work_ratio:.2f}x)")
    rows = [
        [name, f"{1e3 * per_step[name]:.1f}", f"{1e3 * spread[name][0]:.1f}", f"{1e3 * spread[name][1]:.1f}"]
        for name in PATHS
    ]
    print_table(["path", "ms/step (mean of per-batch medians)", "fastest step ms", "slowest step ms"], rows)
    print_verdict("naive / compacted step time", per_step["naive"] / per_step["compacted"], GOAL)


if __name__ == "__main__":
    main()
