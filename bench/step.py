"""looplab's training step against the textbook implementation (``textbook.py``), side by side.

Two configurations:

- ``stars-toy``: the STARS toy model: d = 128, 4 heads, d_ff = 256, one
  post-sandwich LayerNorm layer looped 8 or 16 times, learned positions, batch
  64, binary addition of 15 bits (sequence 17), 2 threads. Plain steps, and
  steps with the Jacobian penalty (weight 0.1, no power iterations): looplab's
  ``jvp`` and ``vjp`` estimators against the textbook's ‖vᵀJ‖².
- ``stopping-size``: the stopping preset's width on one thread (what every sweep
  worker runs): d = 64, 4 heads, MLP ratio 4, 3 pre-norm layers, causal NoPE,
  binary addition n ~ U{1..10}, batch 64, the ``fixed`` schedule at depth 11 and
  the ``matched`` one (depth T(n) per row; the textbook runs every row to the
  batch's deepest and takes each row's logits at its own depth).

Both paths sample their batches from the same task, timed interleaved in one
process. Before timing, the textbook model is loaded with looplab's weights and
their logits compared, so both compute the same function.

Goal: looplab never slower than the textbook (ratio ≥ 1.0) on every row. Both run
the same ATen kernels, so the margin comes from choosing among them (the attention
kernel by sequence length, one fused q/k/v projection, active-set compaction), not from
arithmetic of their own.

    python bench/step.py [--repeats 20] [--only stars-toy|stopping-size]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from textbook import TextbookConfig, TextbookLoopedTransformer, attention_mask, copy_weights, training_step
from throughput import make_trainer
from timing import add_common_options, median, print_table, print_verdict, setup, time_interleaved

from looplab.config import load_config
from looplab.experiment import Experiment, training_depth
from looplab.seeding import derive_generator

GOAL = 1.0


@dataclass
class Case:
    """One row: a looplab config, the textbook's Jacobian weight, and the thread count."""

    label: str
    overrides: list[str]
    threads: int
    jsrr_weight: float = 0.0


def stars_toy(loops: int, estimator: str) -> list[str]:
    return [
        "task.name=binary_addition",
        "task.train_min=15",
        "task.train_max=15",
        "model.d_model=128",
        "model.n_heads=4",
        "model.mlp_ratio=2",
        "model.core_layers=1",
        "model.placement=post_sandwich",
        "model.positional=learned",
        "schedule.name=fixed",
        f"schedule.depth={loops}",
        f"stability.jsrr.estimator={estimator}",
        "stability.jsrr.weight=0.1",
        "stability.jsrr.power_iters=0",
        "train.batch_size=64",
    ]


def stopping_size(schedule: str) -> list[str]:
    return [
        "task.name=binary_addition",
        "task.train_min=1",
        "task.train_max=10",
        "model.d_model=64",
        "model.n_heads=4",
        "model.core_layers=3",
        "model.positional=nope",
        "model.causal=true",
        f"schedule.name={schedule}",
        "schedule.depth=11",
        "train.batch_size=64",
    ]


CASES = {
    "stars-toy": [
        Case(f"{loops} loops, {name}", stars_toy(loops, estimator), threads=2, jsrr_weight=weight)
        for loops in (8, 16)
        for name, estimator, weight in (("plain", "none", 0.0), ("JSRR jvp", "jvp", 0.1), ("JSRR vjp", "vjp", 0.1))
    ],
    "stopping-size": [
        Case(f"{schedule} depth", stopping_size(schedule), threads=1) for schedule in ("fixed", "matched")
    ],
}


def textbook_runner(exp: Experiment, jsrr_weight: float):
    """A closure running the textbook's next training step on ``exp``'s task, config and initial weights."""
    cfg = exp.config
    model = TextbookLoopedTransformer(
        TextbookConfig(
            vocab_size=exp.task.vocab_size,
            d_model=cfg.model.d_model,
            n_heads=cfg.model.n_heads,
            d_ff=cfg.model.mlp_ratio * cfg.model.d_model,
            layers=cfg.model.core_layers,
            placement=cfg.model.placement,
            positions="learned" if cfg.model.positional == "learned" else "none",
            causal=cfg.model.causal,
            window=cfg.model.attention_window,
            max_len=cfg.model.max_len,
            jsrr_weight=jsrr_weight,
        )
    )
    copy_weights(exp.model, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    steps = iter(range(1, 1 << 62))

    def run() -> None:
        step = next(steps)
        generator = derive_generator(cfg.run.seed, "train", step)
        lengths = torch.randint(
            cfg.task.train_min, cfg.task.train_max + 1, (cfg.train.batch_size,), generator=generator
        )
        batch = exp.task.sample_lengths(lengths, generator)
        depths = exp.schedule.train_depths(batch.lengths, generator)
        training_step(model, optimizer, batch, depths, generator)

    return model, run


def logit_difference(exp: Experiment, model: TextbookLoopedTransformer) -> float:
    """max |logits| difference of the two models on one batch at the config's depth."""
    cfg = exp.config
    generator = derive_generator(cfg.run.seed, "check", 0)
    lengths = torch.randint(cfg.task.train_min, cfg.task.train_max + 1, (16,), generator=generator)
    batch = exp.task.sample_lengths(lengths, generator)
    loops = training_depth(cfg)  # the deepest depth the schedule trains at
    with torch.no_grad():
        ours = exp.model(batch.tokens, batch.valid, loops)
        theirs = model(batch.tokens, attention_mask(batch.valid, cfg.model.causal, cfg.model.attention_window), loops)
    return float((ours - theirs[0])[batch.valid].abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CASES), help="run one configuration")
    add_common_options(parser, repeats=20, warmup=3)
    args = parser.parse_args()
    ratios = {}
    for name, cases in CASES.items():
        if args.only and name != args.only:
            continue
        rows = []
        for case in cases:
            setup(case.threads, args.seed)
            # the textbook starts from looplab's initial weights: copied before either path takes a step
            exp, ours = make_trainer(load_config(None, [*case.overrides, f"run.seed={args.seed}"]))
            model, theirs = textbook_runner(exp, case.jsrr_weight)
            difference = logit_difference(exp, model)
            seconds = time_interleaved({"looplab": ours, "textbook": theirs}, args.repeats, args.warmup)
            ratio = median(seconds["textbook"]) / median(seconds["looplab"])
            ratios[f"textbook / looplab step, {name}, {case.label}"] = ratio
            rows.append(
                [
                    case.label,
                    case.threads,
                    f"{1e3 * median(seconds['looplab']):.1f}",
                    f"{1e3 * median(seconds['textbook']):.1f}",
                    f"{ratio:.2f}x",
                    f"{difference:.1e}",
                ]
            )
        print(f"{name}: training step, median of {args.repeats} interleaved")
        print_table(["case", "threads", "looplab ms", "textbook ms", "textbook / looplab", "max |Δ logits|"], rows)
    for label, ratio in ratios.items():
        print_verdict(label, ratio, GOAL)


if __name__ == "__main__":
    main()
