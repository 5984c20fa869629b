"""Training throughput (tokens/s) and achieved GFLOP/s against the measured fp32 matmul peak.

Measures the library's own training step (:func:`looplab.train.trainer.train_step`:
batch sampling, ``forward_at_depths``, loss, backward, clipping, AdamW) on
``binary_addition`` with lengths n uniform in 16..19 (sequence width
L = n_max + 1 = 20), batch 64, ``fixed`` schedule at depth 20 (every row runs
all 20 loops), 2 core layers, no prelude or coda, MLP ratio 4, head dim 32
(4 heads at d_model 128, 8 heads at d_model 256).

FLOPs are counted analytically over the padded batch (the work the kernels do):

    per token and core-layer application, forward:
        2 · (3d² + d² + 2·r·d²)   the linears: qkv, attention out, MLP in and out (r = MLP ratio)
      + 2 · 2 · L · d             attention scores QKᵀ and the weighted sum AV
    per step:
        FLOPs = 3 · B · L · loops · core_layers · (2·(4 + 2r)·d² + 4·L·d)

where 3 = forward + backward (backward ≈ 2× forward). Embedding, norms,
RoPE, softmax, the readout head (2·d·V per token, < 0.1 %) and AdamW are not
counted, so the achieved rate is a lower bound on the arithmetic done.
Tokens/s counts the B · L positions of a step (93 % of them are real tokens
at these lengths). L assumes a batch holds at least one row of the longest
length, which for batch 64 and four lengths fails with probability 1e-8.

The baseline is the peak of the same machine in the same run: a large fp32
``torch.mm`` (2048 × 2048 @ 2048 × 2048 by default) with the same thread count.
Goal: achieved ≥ 60 % of that peak at d_model = 256. A last row runs the
stopping preset's width (d = 64, 4 heads of 16, 3 core layers) on one thread
against a one-thread peak measured in the same run: the size every sweep
worker trains at (reported; no goal).

    python bench/throughput.py [--d-models 128 256] [--batch 64] [--threads 2] [--profile]
"""

from __future__ import annotations

import argparse
import os

import torch
from timing import add_common_options, median, print_measure, print_table, print_verdict, setup, time_interleaved

from looplab.config import Config, ScheduleConfig, validate
from looplab.experiment import Experiment
from looplab.train.trainer import make_optimizer, train_step

GOAL_PERCENT = 60.0
GOAL_D_MODEL = 256
# the stopping preset's width, head dimension and depth at one thread (what a sweep worker runs)
PRESET_D_MODEL, PRESET_HEADS, PRESET_LAYERS = 64, 4, 3


def step_flops(batch: int, length: int, loops: int, layers: int, d_model: int, mlp_ratio: int) -> float:
    """Analytic FLOPs of one training step (forward + backward of the core layers), per the module docstring."""
    per_token_layer = 2 * (4 + 2 * mlp_ratio) * d_model**2 + 4 * length * d_model
    return 3.0 * batch * length * loops * layers * per_token_layer


def matmul_peak(size: int, repeats: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """Median GFLOP/s of ``torch.mm`` on two random [size, size] matrices of ``dtype``."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(size, size, device=device, dtype=dtype)
    seconds = time_interleaved({"mm": lambda: torch.mm(a, b, out=out)}, repeats, warmup=2)["mm"]
    return 2.0 * size**3 / median(seconds) / 1e9


def make_config(args: argparse.Namespace, d_model: int, n_heads: int, layers: int) -> Config:
    """The run config for one model: fixed depth, no lr warm-up, lengths and batch from ``args``."""
    config = Config()
    config.task.name = "binary_addition"
    config.task.train_min, config.task.train_max = args.min_length, args.max_length
    config.schedule = ScheduleConfig(name="fixed", depth=args.loops)
    config.model.d_model, config.model.n_heads = d_model, n_heads
    config.model.core_layers, config.model.mlp_ratio = layers, args.mlp_ratio
    config.train.batch_size = args.batch
    config.train.warmup_steps = 0
    config.run.seed, config.run.device, config.run.precision = args.seed, args.device, args.precision
    validate(config)
    return config


def make_trainer(config: Config):
    """A closure that runs the next training step of a fresh experiment built from ``config``."""
    exp = Experiment.build(config)
    exp.model.train()
    optimizer = make_optimizer(exp)
    counter = iter(range(1, 1 << 62))
    return exp, lambda: train_step(exp, optimizer, next(counter))


# Where a step's time goes, by op name: the first category whose pattern occurs in the op's name.
CATEGORIES = (
    ("attention", ("attention", "softmax", "bmm", "baddbmm")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::matmul")),
    (
        "copies and compaction bookkeeping",
        (
            "copy_",
            "cat",
            "stack",
            "index",
            "gather",
            "scatter",
            "nonzero",
            "argsort",
            "sort",
            "where",
            "clone",
            "contiguous",
        ),
    ),
    ("norms", ("layer_norm", "rms_norm")),
    ("optimizer and clipping", ("Optimizer", "adam", "_foreach", "clip", "norm")),
    ("elementwise", ("gelu", "add", "mul", "sub", "div", "exp", "log", "neg", "fill_", "zero_", "sum", "mean")),
)


def category(op: str) -> str:
    """The CATEGORIES name of a profiler op; "other (allocation, views, dispatch)" when none matches."""
    for name, patterns in CATEGORIES:
        if any(pattern in op for pattern in patterns):
            return name
    return "other (allocation, views, dispatch)"


def profile_step(run_step, top: int) -> None:
    """Print the ops taking the most self CPU time in one training step, then the time by category, and
    what the profiled ops leave of the step's wall time (Python and autograd overhead)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        began = time.perf_counter()
        run_step()
        wall = time.perf_counter() - began
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [
        [e.key, e.count, f"{e.self_cpu_time_total / 1e3:.1f}", f"{100 * e.self_cpu_time_total / total:.1f}"]
        for e in events[:top]
    ]
    print_table(["op", "calls", "self ms", "share %"], rows)
    by_category: dict[str, float] = {}
    for event in events:
        by_category[category(event.key)] = by_category.get(category(event.key), 0.0) + event.self_cpu_time_total
    rows = [
        [name, f"{us / 1e3:.1f}", f"{100 * us / total:.1f}"]
        for name, us in sorted(by_category.items(), key=lambda kv: -kv[1])
    ]
    print_table(["category", "self ms", "share %"], rows)
    print(
        f"profiled ops {total / 1e3:.0f} ms of a {1e3 * wall:.0f} ms step (under the profiler); "
        f"the rest is Python and autograd bookkeeping outside any op"
    )


def measure(args: argparse.Namespace, d_model: int, n_heads: int, layers: int, peak: float, profile: bool) -> list:
    """One table row: the median step time of a fresh model and its rate against ``peak`` (GFLOP/s)."""
    config = make_config(args, d_model, n_heads, layers)
    exp, run_step = make_trainer(config)
    seconds = median(time_interleaved({"step": run_step}, args.repeats, args.warmup)["step"])
    length = args.max_length + 1
    flops = step_flops(args.batch, length, args.loops, layers, d_model, args.mlp_ratio)
    achieved = flops / seconds / 1e9
    params = sum(p.numel() for p in exp.model.parameters())
    if profile:
        print(f"profile of one step at d_model {d_model}, {torch.get_num_threads()} thread(s) (self CPU time):")
        profile_step(run_step, top=12)
    return [
        d_model,
        f"{n_heads}x{d_model // n_heads}",
        layers,
        torch.get_num_threads(),
        f"{params / 1e6:.2f}M",
        f"{1e3 * seconds:.0f}",
        f"{args.batch * length / seconds:,.0f}",
        f"{flops / 1e9:.1f}",
        f"{achieved:.1f}",
        f"{100 * achieved / peak:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-models", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--head-dim", type=int, default=32, help="n_heads = d_model / head_dim")
    parser.add_argument("--layers", type=int, default=2, help="core layers")
    parser.add_argument("--mlp-ratio", type=int, default=4)
    parser.add_argument("--loops", type=int, default=20, help="fixed training depth")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=19)
    parser.add_argument("--peak-size", type=int, default=2048, help="square matmul size for the peak")
    parser.add_argument("--profile", action="store_true", help="profile one step of every model")
    parser.add_argument("--no-preset-size", action="store_true", help="skip the one-thread d = 64 row")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast (for a GPU)")
    add_common_options(parser, repeats=10, warmup=1)
    args = parser.parse_args()
    setup(args.threads, args.seed)

    load_before = os.getloadavg()[0]
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = matmul_peak(args.peak_size, max(5, args.repeats), args.device, dtype)
    rows = [measure(args, d, d // args.head_dim, args.layers, peak, args.profile) for d in args.d_models]
    percent = {row[0]: float(row[-1]) for row in rows}
    peak_one = None
    if not args.no_preset_size and args.device == "cpu":  # the stopping preset's width, as a sweep worker runs it
        torch.set_num_threads(1)
        peak_one = matmul_peak(args.peak_size, repeats=5)
        rows.append(measure(args, PRESET_D_MODEL, PRESET_HEADS, PRESET_LAYERS, peak_one, args.profile))
        torch.set_num_threads(args.threads)

    length = args.max_length + 1
    print(
        f"throughput: binary_addition n ~ U{{{args.min_length}..{args.max_length}}} (L = {length}), "
        f"batch {args.batch}, fixed depth {args.loops}, MLP ratio {args.mlp_ratio}, {args.precision} on {args.device}"
    )
    print(
        f"timing: {args.warmup} warm-up + {args.repeats} timed train_step calls per model; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        f"peak: torch.mm {args.peak_size}x{args.peak_size} fp32 = {peak:.1f} GFLOP/s on {args.threads} threads", end=""
    )
    print(f", {peak_one:.1f} GFLOP/s on 1 thread" if peak_one else "")
    headers = ["d_model", "heads x dim", "layers", "threads", "params", "ms/step", "tokens/s", "GFLOP/step"]
    print_table([*headers, "GFLOP/s", "% of peak"], rows)
    if GOAL_D_MODEL in percent:
        print_verdict(f"achieved / peak at d_model {GOAL_D_MODEL}", percent[GOAL_D_MODEL], GOAL_PERCENT, unit="%")
    else:
        print(f"RATIO not computed: d_model {GOAL_D_MODEL} not among --d-models")
    if peak_one:
        print_measure(f"achieved / one-thread peak at d_model {PRESET_D_MODEL}, 1 thread", float(rows[-1][-1]), "%")


if __name__ == "__main__":
    main()
