"""SmolLM2-135M's stages of inference, as is and retrofitted, with and without the massive-activation MLP.

The feed-forward model is SmolLM2 itself (a retrofit of all 30 layers run once, which
computes exactly the original). Its 30-layer ColSum curve, resampled to 6 blocks, is the
reference each loop of the (4, 6⊗4, 4) retrofit is held against (stage alignment and
amplitude, docs/methods.md §7), for W_I = ``state`` and ``mix``, untrained. Then the MLP
whose output is largest in the feed-forward pass (the layer that writes the massive
activation) is zeroed — in the retrofit, which drops the middle layers and runs its coda after
the loop, the largest of its prelude and core —
and so is layer 2's, the one the paper names; as a control, the retrofit's MLP with the
smallest output.

Writes ``OUT/retrofit_stages.csv``: model, condition, zeroed MLP (as a Llama layer index),
loop, layer, ColSum concentration and sink mass. Needs the lm extra.

    python -m looplab.studies.mechanistic.smollm2_stages --out docs/results/mechanistic-trained
"""

from __future__ import annotations

import argparse
import csv
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from looplab.analysis.colsum import colsum_trace
from looplab.analysis.massive import mlp_output_max, zero_mlp
from looplab.analysis.stages import sink_mass
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model.trace import trace
from looplab.studies.mechanistic.smollm2_retrofit import text_chunks
from looplab.text.pretrained import load_smollm2

SHAPE = (4, 6, 4)  # (p, k, c), as the retrofit study
LOOPS = 4
INJECTS = ("state", "mix")
PAPER_LAYER = 2  # the layer the paper names as writing the massive activation in the retrofitted Llama
FILE = "retrofit_stages.csv"


def llama_layer(name: str, shape: tuple[int, int, int], n_layers: int) -> int:
    """The original layer index of a retrofit's MLP name (``preludeI``, ``coreI``, ``codaI``)."""
    p, k, c = shape
    site, index = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")) :])
    return {"prelude": index, "core": p + index, "coda": n_layers - c + index}[site]


def retrofit_name(layer: int, shape: tuple[int, int, int], n_layers: int) -> str | None:
    """A Llama layer's MLP name in the retrofit (None when the retrofit drops that layer)."""
    p, k, c = shape
    if layer < p:
        return f"prelude{layer}"
    if layer < p + k:
        return f"core{layer - p}"
    if layer >= n_layers - c:
        return f"coda{layer - (n_layers - c)}"
    return None


@torch.no_grad()
def ablation_rows(looped, ids, mask, loops: int, label: str, conditions, n_layers: int) -> list[dict]:
    """:func:`stage_rows` of a (p, k, c) = ``SHAPE`` retrofit under each (condition, Llama layer whose MLP is
    zeroed, or None for none)."""
    rows = []
    for condition, layer in conditions:
        with zero_mlp(looped, retrofit_name(layer, SHAPE, n_layers)) if layer is not None else nullcontext():
            rows += stage_rows(looped, ids, mask, loops, label, condition, layer)
    return rows


def stage_rows(model, ids, mask, loops: int, label: str, condition: str, zeroed: int | None) -> list[dict]:
    """ColSum and sink mass per (loop, core layer) of one traced pass."""
    valid = mask.bool()
    recorded = trace(model, ids, valid, loops, attention=True)
    colsum = colsum_trace(recorded).mean(-1)
    sink = sink_mass(recorded.attention(), valid).mean((-1, -2))
    return [
        {
            "model": label,
            "condition": condition,
            "zeroed_layer": "" if zeroed is None else zeroed,
            "loop": t + 1,
            "layer": layer,
            "colsum": round(float(colsum[t, layer]), 6),
            "sink_mass": round(float(sink[t, layer]), 6),
        }
        for t in range(colsum.shape[0])
        for layer in range(colsum.shape[1])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--texts", type=int, default=8, help="validation passages")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per passage")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model, tokenizer = load_smollm2()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    batch = tokenizer(
        text_chunks("val", args.texts, 400, args.seed),
        return_tensors="pt",
        truncation=True,
        max_length=args.tokens,
        padding=True,
    )
    ids, mask = batch["input_ids"], batch["attention_mask"]
    n_layers = len(model.model.layers)
    feedforward = RetrofittedLoop(model, 0, n_layers, 0, inject_init="state")
    largest = {
        int(name.removeprefix("core")): value
        for name, value in mlp_output_max(feedforward, lambda: feedforward(ids, mask, loops=1), mask.bool()).items()
    }
    massive = max(largest, key=largest.get)
    # the retrofit drops the middle layers, and its coda runs after the loop: the MLP that can write the
    # loop's massive activation is the largest in its prelude and core
    kept = max((layer for layer in largest if layer < SHAPE[0] + SHAPE[1]), key=largest.get)
    rows = stage_rows(feedforward, ids, mask, 1, "feedforward", "base", None)
    for condition, layer in (("zero_massive", massive), ("zero_layer2", PAPER_LAYER)):
        with zero_mlp(feedforward, f"core{layer}"):
            rows += stage_rows(feedforward, ids, mask, 1, "feedforward", condition, layer)
    for inject in INJECTS:
        looped = RetrofittedLoop(model, *SHAPE, inject_init=inject)
        own = mlp_output_max(looped, partial(looped, ids, mask, loops=LOOPS), mask.bool())
        control = llama_layer(min(own, key=own.get), SHAPE, n_layers)
        conditions = (("base", None), ("zero_massive", kept), ("zero_layer2", PAPER_LAYER), ("zero_control", control))
        rows += ablation_rows(looped, ids, mask, LOOPS, f"retrofit-{inject}", conditions, n_layers)
    top = sorted(largest, key=largest.get, reverse=True)[:5]
    print("largest MLP outputs (layer: max |out|): " + ", ".join(f"{layer}: {largest[layer]:.1f}" for layer in top))
    print(f"zeroed: layer {massive} in the feed-forward model, layer {kept} in the retrofit, and layer {PAPER_LAYER}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / FILE).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / FILE}")


if __name__ == "__main__":
    main()
