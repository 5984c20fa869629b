"""Stages of inference in a trained SmolLM2 retrofit
(docs/results/mechanistic-trained/retrofit-trained/PROTOCOL.md): the blocks.

Each seed's folder ``seed-S/`` holds what ``python -m looplab.studies.mechanistic.smollm2_trained_stages``
wrote: ``stages.csv`` (step, condition, zeroed Llama layer, loop, layer: ColSum concentration and
sink mass), ``mlps.csv`` (step, MLP, Llama layer, max |output|), ``losses.csv`` (step, loops,
held-out loss) and ``train.csv`` (the fine-tune's loss per step). The reference is SmolLM2's own
curve (``retrofit_stages.csv``, feed-forward, base). Decision rules, stated in the protocol before
any run, read at its last step (Student-t 95 % intervals):

    learned                            held-out loss at the training depth below step 0's, per seed
    each loop repeats the stages       alignment                              "holds" above 0
    the largest MLP is the precondition amplitude after / before zeroing it   "holds" below 0.5, with
                                       alignment after < before for every seed
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from looplab.report.aggregate import t_interval
from looplab.report.pages import markdown_table, register_block, register_frozen
from looplab.studies.mechanistic.cells import few_seeds, interval_verdict, mean_cell, three_decimals
from looplab.studies.mechanistic.trained import (
    CORRELATION,
    HALVED,
    RETROFIT_FILE,
    STUDY,
    colsum_curves,
)

FOLDER = "retrofit-trained"
TRAIN_LOOPS = 8  # the protocol's training depth
DECISION_STEP = 200  # the protocol's last read, where its rules are read
CONDITIONS = ("base", "zero_massive", "zero_layer2", "zero_control")
LOSS_LOOPS = (1, 4, 8, 16)
CORE_LAYERS = range(4, 10)  # the Llama layers of the retrofit's core
NOT_YET = "n/a: no seed has been read yet (0 seeds)"

register_frozen(f"{STUDY}/{FOLDER}", f"{STUDY}/{FOLDER}/PROTOCOL.md")


def _seed_files(results_dir: Path, name: str) -> pd.DataFrame:
    """One file of every seed's folder, stacked (an empty frame when none is there yet)."""
    paths = sorted((results_dir / STUDY / FOLDER).glob(f"seed-*/{name}"))
    return pd.concat([pd.read_csv(p) for p in paths], ignore_index=True) if paths else pd.DataFrame()


def _reference(results_dir: Path) -> torch.Tensor:
    """SmolLM2's own ColSum curve over its layers [K], the reference of every loop."""
    rows = pd.read_csv(results_dir / STUDY / RETROFIT_FILE)
    base = rows[(rows.model == "feedforward") & (rows.condition == "base")].sort_values("layer")
    return torch.tensor(base.colsum.to_numpy(), dtype=torch.float64)


def stage_measures(results_dir: Path) -> pd.DataFrame:
    """Per (seed, step, condition): the zeroed layer, stage alignment (mean over loops of each loop's
    correlation with the reference; NaN where a curve is constant), amplitude and max sink mass; and
    ``core_alignment``, the same against SmolLM2's own curve over :data:`CORE_LAYERS`, the layers the
    core was cut from (exploratory, not the protocol's reference)."""
    from looplab.analysis.stages import stage_alignment, stage_amplitude

    stages = _seed_files(results_dir, "stages.csv")
    if stages.empty:
        columns = ["seed", "step", "condition", "zeroed_layer", "alignment", "core_alignment", "amplitude", "sink"]
        return pd.DataFrame(columns=columns)
    reference = _reference(results_dir)
    own = reference[CORE_LAYERS.start : CORE_LAYERS.stop]
    rows = []
    for (seed, step, condition), part in stages.groupby(["seed", "step", "condition"], sort=False):
        curves = colsum_curves(part)
        zeroed = part.zeroed_layer.iloc[0]
        rows.append(
            {
                "seed": int(seed),
                "step": int(step),
                "condition": condition,
                "zeroed_layer": None if pd.isna(zeroed) else int(zeroed),
                "alignment": float(np.nanmean(stage_alignment(curves, reference).numpy())),
                "core_alignment": float(np.nanmean(stage_alignment(curves, own).numpy())),
                "amplitude": float(stage_amplitude(curves).mean()),
                "sink": float(part.sink_mass.max()),
            }
        )
    return pd.DataFrame(rows)


@register_block(f"{STUDY}/retrofit-trained")
def retrofit_trained_block(results_dir: Path) -> str:
    """Per seed and read step: held-out loss by loops, and alignment / amplitude intact and with each MLP zeroed."""
    measures, losses = stage_measures(results_dir), _seed_files(results_dir, "losses.csv")
    if measures.empty:
        return NOT_YET
    loss = losses.pivot_table(index=["seed", "step"], columns="loops", values="val_loss")
    cells = measures.set_index(["seed", "step", "condition"])
    body = []
    for seed, step in measures[["seed", "step"]].drop_duplicates().itertuples(index=False):
        row = [str(seed), str(step), " / ".join(f"{loss.loc[(seed, step), r]:.2f}" for r in LOSS_LOOPS)]
        for condition in CONDITIONS:
            if (seed, step, condition) not in cells.index:
                row.append("n/a")
                continue
            cell = cells.loc[(seed, step, condition)]
            layer = "" if condition in ("base", "zero_layer2") else f"layer {int(cell.zeroed_layer)}: "
            row.append(f"{layer}{three_decimals(cell.alignment)} / {three_decimals(cell.amplitude)}")
        row.append(three_decimals(cells.loc[(seed, step, "base")].sink))
        body.append(row)
    header = [
        "seed",
        "step",
        "held-out loss at " + " / ".join(str(r) for r in LOSS_LOOPS) + " loops",
        "intact: alignment / amplitude",
        "largest prelude/core MLP zeroed",
        "layer 2 zeroed",
        "smallest MLP zeroed",
        "max sink mass",
    ]
    return markdown_table(header, body)


@register_block(f"{STUDY}/retrofit-trained-decisions")
def retrofit_trained_decisions_block(results_dir: Path) -> str:
    """The protocol's rules at its last read step, each with its interval, seed count and verdict."""
    measures, losses = stage_measures(results_dir), _seed_files(results_dir, "losses.csv")
    if measures.empty:
        return NOT_YET
    last = DECISION_STEP
    at_depth = losses[losses.loops == TRAIN_LOOPS].pivot(index="seed", columns="step", values="val_loss")
    learned = [int(s) for s in at_depth.index if last in at_depth and at_depth.loc[s, last] < at_depth.loc[s, 0]]
    lines = [
        f"- Learned (held-out loss at {TRAIN_LOOPS} loops below step 0's at step {last}): "
        f"{len(learned)} of {len(at_depth)} seeds (a seed not yet read at step {last} counts as not learned)."
    ]
    cells = measures[(measures.step == last) & measures.seed.isin(learned)].set_index(["seed", "condition"])
    seeds = sorted({seed for seed, _ in cells.index})
    if not seeds:
        return "\n".join([*lines, f"- The stage rules: n/a (0 learned seeds read at step {last})."])
    alignment = np.array([cells.loc[(s, "base")].alignment for s in seeds])
    untrained = measures[(measures.step == 0) & (measures.condition == "base")].set_index("seed").alignment
    change = alignment - np.array([untrained.loc[s] for s in seeds])
    low, high = np.clip(t_interval(alignment), *CORRELATION)
    lines.append(
        f"- Each loop repeats SmolLM2's stages: alignment {mean_cell(alignment)}; change from the untrained "
        f"retrofit {mean_cell(change)}{few_seeds(len(seeds))}: "
        f"**{interval_verdict(low, high, 0.0, True)}**."
    )
    ratios = {}
    for condition in CONDITIONS[1:]:
        ratios[condition] = np.array(
            [cells.loc[(s, condition)].amplitude / cells.loc[(s, "base")].amplitude for s in seeds]
        )
    low, high = t_interval(ratios["zero_massive"])
    verdict = interval_verdict(low, high, HALVED, False)
    lowered = all(cells.loc[(s, "zero_massive")].alignment < cells.loc[(s, "base")].alignment for s in seeds)
    if verdict == "holds" and not lowered:
        verdict = "not resolved"
    zeroed = sorted({int(cells.loc[(s, "zero_massive")].zeroed_layer) for s in seeds})
    lines.append(
        f"- The largest prelude/core MLP (layer {', '.join(map(str, zeroed))}) is the precondition: amplitude "
        f"after / before zeroing it {mean_cell(ratios['zero_massive'])}; alignment lower after zeroing for "
        f"{'every' if lowered else 'not every'} seed: **{verdict}**. Beside it, layer 2 zeroed: "
        f"{mean_cell(ratios['zero_layer2'])}; the smallest MLP zeroed (control): {mean_cell(ratios['zero_control'])}."
    )
    own = measures[(measures.condition == "base") & measures.seed.isin(seeds)].set_index(["step", "seed"])
    own = own.core_alignment
    lines.append(
        f"- Exploratory (chosen after seeing the data, deciding nothing): each loop against SmolLM2's own "
        f"layers {CORE_LAYERS.start}–{CORE_LAYERS.stop - 1}, the ones the core was cut from: alignment "
        f"{three_decimals(own.loc[0].iloc[0])} untrained, {mean_cell(own.loc[last].to_numpy())} at step {last}."
    )
    return "\n".join(lines)


@register_block(f"{STUDY}/retrofit-trained-mlps")
def retrofit_trained_mlps_block(results_dir: Path) -> str:
    """The largest MLP outputs per read step (mean over seeds): do massive values grow in training?"""
    mlps = _seed_files(results_dir, "mlps.csv")
    if mlps.empty:
        return NOT_YET
    mean = mlps.groupby(["step", "mlp", "layer"], sort=False).max_abs_output.agg(["mean", "count"]).reset_index()
    body = []
    for step, part in mean.groupby("step"):
        top = part.sort_values("mean", ascending=False).head(3)
        listed = ", ".join(f"{m} (layer {int(lay)}) {v:.1f}" for m, lay, v in zip(top.mlp, top.layer, top["mean"]))
        body.append([str(step), str(int(part["count"].max())), listed])
    return markdown_table(["step", "seeds", "largest max abs. output (mean over seeds)"], body)
