"""A trained SmolLM2 retrofit's stages of inference, with and without the MLP that writes its largest values.

The (4, 6⊗r, 4) retrofit of SmolLM2-135M with W_I = ``mix`` (the input injected at every
loop) is fine-tuned on KJV training text at a fixed ``--train-loops`` loops, the loss on
the last loop, all weights trained (AdamW, constant ``--lr``, clip 1). Every
``--read-every`` steps (and before the first) the model is read on the same held-out
passages as ``smollm2_stages`` (so SmolLM2's own curve is the reference): ColSum
concentration and sink mass per (loop, core layer) at the training depth, intact and with
one MLP zeroed — the largest max |output| among prelude and core (the MLPs that run before
or inside the loop), Llama layer 2 (the paper's), and the smallest (the control) — the max
|output| of every MLP, and the held-out loss at 1, 4, 8 and 16 loops.

Writes ``OUT/seed-SEED/``: ``stages.csv`` (step, condition, zeroed layer, loop, layer,
colsum, sink mass), ``mlps.csv`` (step, MLP, Llama layer, max |output|), ``losses.csv``
(step, loops, held-out loss) after every read, and ``train.csv`` (the fine-tune's loss per
step) at the end. Needs the lm extra.

    python -m looplab.studies.mechanistic.smollm2_trained_stages --out runs/retrofit-trained --seed 740
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from looplab.analysis.massive import mlp_output_max
from looplab.lm.retrofit import RetrofittedLoop
from looplab.seeding import derive_generator
from looplab.studies.mechanistic.smollm2_retrofit import passages, text_chunks
from looplab.studies.mechanistic.smollm2_stages import PAPER_LAYER, SHAPE, ablation_rows, llama_layer
from looplab.tasks.corpus import load_corpus
from looplab.text.finetune import fine_tune, last_loop_objective, next_token_batch, next_token_loss, token_mean_loss
from looplab.text.pretrained import load_smollm2

LOSS_LOOPS = (1, 4, 8, 16)
PASSAGE_CHARS = 400


def training_batches(tokenizer, seed: int, size: int, tokens: int):
    """Step s → ``size`` passages of the train split drawn from (seed, s), as a next-token batch."""
    text = load_corpus().text("train")

    def batch_at(step: int) -> dict:
        encoded = tokenizer(
            passages(text, size, PASSAGE_CHARS, derive_generator(seed, "trained-retrofit", step)),
            return_tensors="pt",
            truncation=True,
            max_length=tokens,
            padding=True,
        )
        return next_token_batch(encoded["input_ids"], encoded["attention_mask"])

    return batch_at


@torch.no_grad()
def read(looped: RetrofittedLoop, ids, mask, loops: int, n_layers: int, step: int) -> tuple[list, list, list]:
    """The stage, MLP and loss rows of one read at fine-tuning step ``step``."""
    valid = mask.bool()
    largest = mlp_output_max(looped, partial(looped, ids, mask, loops=loops), valid)
    mlps = [
        {"step": step, "mlp": name, "layer": llama_layer(name, SHAPE, n_layers), "max_abs_output": round(v, 4)}
        for name, v in largest.items()
    ]
    inside = {name: v for name, v in largest.items() if not name.startswith("coda")}
    massive = llama_layer(max(inside, key=inside.get), SHAPE, n_layers)
    control = llama_layer(min(largest, key=largest.get), SHAPE, n_layers)
    conditions = (("base", None), ("zero_massive", massive), ("zero_layer2", PAPER_LAYER), ("zero_control", control))
    rows = ablation_rows(looped, ids, mask, loops, "retrofit-mix-trained", conditions, n_layers)
    stages = [{"step": step, **row} for row in rows]
    losses = [
        {"step": step, "loops": r, "val_loss": round(float(next_token_loss(looped(ids, mask, loops=r), ids, mask)), 5)}
        for r in LOSS_LOOPS
    ]
    return stages, mlps, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, required=True, help="draws the training passages")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--train-loops", type=int, default=8)
    parser.add_argument("--read-every", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="passages per step")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per passage")
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    out = Path(args.out) / f"seed-{args.seed}"
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_smollm2()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    held_out = tokenizer(
        text_chunks("val", 8, PASSAGE_CHARS, 0), return_tensors="pt", truncation=True, max_length=64, padding=True
    )
    ids, mask = held_out["input_ids"], held_out["attention_mask"]
    n_layers = len(model.model.layers)
    looped = RetrofittedLoop(model, *SHAPE, inject_init="mix")
    tables: dict[str, list] = {"stages": [], "mlps": [], "losses": []}

    def probe(step: int) -> None:
        for name, rows in zip(tables, read(looped, ids, mask, args.train_loops, n_layers, step)):
            tables[name] += [{"seed": args.seed, **row} for row in rows]
            pd.DataFrame(tables[name]).to_csv(out / f"{name}.csv", index=False)
        print(f"step {step}: " + ", ".join(f"{r['loops']} loops {r['val_loss']:.3f}" for r in tables["losses"][-4:]))

    began = time.perf_counter()
    log = fine_tune(
        looped,
        training_batches(tokenizer, args.seed, args.batch, args.tokens),
        args.steps,
        args.lr,
        last_loop_objective(args.train_loops, token_mean_loss),
        probe=probe,
        probe_every=args.read_every,
    )
    log.insert(0, "seed", args.seed)
    log["seconds"] = round(time.perf_counter() - began, 1)
    log.to_csv(out / "train.csv", index=False)
    print(f"wrote {out} ({log.seconds.iloc[-1]:.0f} s)")


if __name__ == "__main__":
    main()
