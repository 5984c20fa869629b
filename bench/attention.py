"""Which attention kernel is faster, by sequence length: the evidence behind ``attention = "auto"``.

Times forward + backward of looplab's ``SelfAttention`` with the fused SDPA kernel and
with the math kernel (softmax written out) on a grid of shapes: batch 64, 4 heads of
16 or 32 channels, sequence lengths 8..256, unmasked bidirectional and padded causal,
at 1 and 2 threads (a sweep worker runs 1). Each row prints SDPA's time over the math
kernel's (> 1: math is faster), the kernel ``auto`` picks (:func:`prefers_math`), and
its regret: the picked kernel's time over the faster one's.

Goal: the geometric mean of the regret over the grid ≤ 1.05 (the rule loses at most 5 %
on average against knowing the faster kernel of every shape in advance); the worst
shape is reported beside it.

    python bench/attention.py [--repeats 20] [--lengths 8 16 32 48 63 64 96 128 256]
"""

from __future__ import annotations

import argparse
import math

import torch
from timing import add_common_options, median, print_measure, print_table, print_verdict, setup, time_interleaved

from looplab.model.attention import AttentionContext, SelfAttention, prefers_math

GOAL = 1.05
BATCH, HEADS = 64, 4


def attention_step(head_dim: int, length: int, padded_causal: bool, use_math: bool, seed: int):
    """A closure running one forward and backward of a fresh ``SelfAttention`` on a fixed input."""
    torch.manual_seed(seed)
    d_model = HEADS * head_dim
    attn = SelfAttention(d_model, HEADS)
    x = torch.randn(BATCH, length, d_model, requires_grad=True)
    valid = torch.ones(BATCH, length, dtype=torch.bool)
    if padded_causal:
        valid[: BATCH // 2, max(1, length - 3) :] = False
    ctx = AttentionContext.build(valid, padded_causal, None, use_math)
    grad = torch.randn(BATCH, length, d_model)

    def run() -> None:
        attn(x, ctx).backward(grad)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 16, 32, 48, 63, 64, 96, 128, 256])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--thread-counts", type=int, nargs="+", default=[1, 2])
    add_common_options(parser, repeats=20, warmup=3)
    args = parser.parse_args()
    rows, regrets = [], []
    for threads in args.thread_counts:
        for head_dim in args.head_dims:
            for padded_causal in (False, True):
                for length in args.lengths:
                    setup(threads, args.seed)
                    paths = {
                        kernel: attention_step(head_dim, length, padded_causal, kernel == "math", args.seed)
                        for kernel in ("sdpa", "math")
                    }
                    seconds = {k: median(v) for k, v in time_interleaved(paths, args.repeats, args.warmup).items()}
                    picked = "math" if prefers_math(length, head_dim, torch.device("cpu"), threads) else "sdpa"
                    regret = seconds[picked] / min(seconds.values())
                    regrets.append(regret)
                    rows.append(
                        [
                            threads,
                            head_dim,
                            "padded causal" if padded_causal else "full bidirectional",
                            length,
                            f"{1e3 * seconds['sdpa']:.2f}",
                            f"{1e3 * seconds['math']:.2f}",
                            f"{seconds['sdpa'] / seconds['math']:.2f}",
                            picked,
                            f"{regret:.2f}",
                        ]
                    )
    print(f"attention forward + backward, batch {BATCH}, {HEADS} heads, median of {args.repeats} interleaved")
    print_table(["threads", "head dim", "mask", "L", "sdpa ms", "math ms", "sdpa / math", "auto picks", "regret"], rows)
    geometric_mean = math.exp(sum(math.log(r) for r in regrets) / len(regrets))
    print_measure("auto kernel's worst regret over the grid", max(regrets))
    print_verdict("auto kernel's regret (geometric mean over the grid)", geometric_mean, GOAL, at_most=True)


if __name__ == "__main__":
    main()
