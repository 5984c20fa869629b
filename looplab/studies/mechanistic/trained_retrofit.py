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

import math
from dataclasses import dataclass
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
from looplab.studies.prose import span

FOLDER = "retrofit-trained"
TRAIN_LOOPS = 8  # the protocol's training depth
DECISION_STEP = 200  # the protocol's last read, where its rules are read
CONDITIONS = ("base", "zero_massive", "zero_layer2", "zero_control")
LOSS_LOOPS = (1, 4, 8, 16)
CORE_LAYERS = range(4, 10)  # the Llama layers of the retrofit's core
NOT_YET = "n/a: no seed has been read yet (0 seeds)"
CHANGE = (-2.0, 2.0)  # a difference of two alignments (correlations)
RATIO = (0.0, math.inf)  # a ratio of two amplitudes (each max − min of a curve, so at least 0)

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


@dataclass(frozen=True)
class Rules:
    """The protocol's rules read at :data:`DECISION_STEP` on the learned seeds, with what is reported beside
    them. Arrays are over ``seeds`` (sorted); ratios are amplitude after / before zeroing, per condition."""

    read: int  # seeds with a held-out loss at the training depth at step 0 and at the decision step
    learned: list[int]
    seeds: list[int]
    alignment: np.ndarray
    change: np.ndarray
    stages: str  # rule 1's verdict
    ratios: dict[str, np.ndarray]
    lowered: bool  # alignment lower after zeroing the largest MLP, for every seed
    precondition: str  # rule 2's verdict
    zeroed: list[int]  # the Llama layer(s) the largest prelude/core MLP was at
    core_untrained: float
    core_trained: np.ndarray


def read_rules(measures: pd.DataFrame, losses: pd.DataFrame) -> Rules | None:
    """The rules from :func:`stage_measures` and the seeds' losses; None when no seed has been read."""
    if measures.empty:
        return None
    last = DECISION_STEP
    at_depth = losses[losses.loops == TRAIN_LOOPS].pivot(index="seed", columns="step", values="val_loss")
    learned = [int(s) for s in at_depth.index if last in at_depth and at_depth.loc[s, last] < at_depth.loc[s, 0]]
    cells = measures[(measures.step == last) & measures.seed.isin(learned)].set_index(["seed", "condition"])
    seeds = sorted({seed for seed, _ in cells.index})
    base = np.array([cells.loc[(s, "base")].alignment for s in seeds])
    untrained = measures[(measures.step == 0) & (measures.condition == "base")].set_index("seed")
    ratios = {
        condition: np.array([cells.loc[(s, condition)].amplitude / cells.loc[(s, "base")].amplitude for s in seeds])
        for condition in CONDITIONS[1:]
    }
    lowered = all(cells.loc[(s, "zero_massive")].alignment < cells.loc[(s, "base")].alignment for s in seeds)
    precondition = interval_verdict(*np.clip(t_interval(ratios["zero_massive"]), *RATIO), HALVED, False)
    if precondition == "holds" and not lowered:
        precondition = "not resolved"
    own = measures[(measures.condition == "base") & measures.seed.isin(seeds)].set_index(["step", "seed"])
    return Rules(
        read=len(at_depth),
        learned=learned,
        seeds=seeds,
        alignment=base,
        change=base - np.array([untrained.alignment.loc[s] for s in seeds]),
        stages=interval_verdict(*np.clip(t_interval(base), *CORRELATION), 0.0, True),
        ratios=ratios,
        lowered=lowered,
        precondition=precondition,
        zeroed=sorted({int(cells.loc[(s, "zero_massive")].zeroed_layer) for s in seeds}),
        core_untrained=float(untrained.core_alignment.iloc[0]) if len(untrained) else float("nan"),
        core_trained=own.core_alignment.loc[last].to_numpy() if seeds else np.array([]),
    )


def _rules(results_dir: Path) -> Rules | None:
    return read_rules(stage_measures(results_dir), _seed_files(results_dir, "losses.csv"))


@register_block(f"{STUDY}/retrofit-trained-decisions")
def retrofit_trained_decisions_block(results_dir: Path) -> str:
    """The protocol's rules at its last read step, each with its interval, seed count and verdict."""
    rules, last = _rules(results_dir), DECISION_STEP
    if rules is None:
        return NOT_YET
    lines = [
        f"- Learned (held-out loss at {TRAIN_LOOPS} loops below step 0's at step {last}): "
        f"{len(rules.learned)} of {rules.read} seeds (a seed not yet read at step {last} counts as not learned)."
    ]
    if not rules.seeds:
        return "\n".join([*lines, f"- The stage rules: n/a (0 learned seeds read at step {last})."])
    ratio = {condition: mean_cell(values, bounds=RATIO) for condition, values in rules.ratios.items()}
    lines += [
        f"- Each loop repeats SmolLM2's stages: alignment {mean_cell(rules.alignment, bounds=CORRELATION)}; "
        f"change from the untrained retrofit {mean_cell(rules.change, bounds=CHANGE)}{few_seeds(len(rules.seeds))}: "
        f"**{rules.stages}**.",
        f"- The largest prelude/core MLP (layer {', '.join(map(str, rules.zeroed))}) is the precondition: amplitude "
        f"after / before zeroing it {ratio['zero_massive']}; alignment lower after zeroing for "
        f"{'every' if rules.lowered else 'not every'} seed: **{rules.precondition}**. Beside it, layer 2 zeroed: "
        f"{ratio['zero_layer2']}; the smallest MLP zeroed (control): {ratio['zero_control']}.",
        f"- Exploratory (chosen after seeing the data, deciding nothing): each loop against SmolLM2's own "
        f"layers {CORE_LAYERS.start}–{CORE_LAYERS.stop - 1}, the ones the core was cut from: alignment "
        f"{three_decimals(rules.core_untrained)} untrained, {mean_cell(rules.core_trained, bounds=CORRELATION)} "
        f"at step {last}.",
    ]
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


# ------------------------------------------------------------------------------ what the data say, generated
# §2c's findings as sentences from the seeds' files: the rules' verdicts with their intervals, and what the
# protocol reports beside them; the page's hand-written interpretation beside each block is marked as such.


#: rule 1's verdict → what it says of the stages rule 2 presupposes (when it does not grant them)
ABSENT = {
    "fails": "rule 1 found absent",
    "not resolved": "rule 1 could not establish",
    "n/a": "rule 1 could not read",
}


def _interval(values, bounds: tuple[float, float]) -> str:
    """mean [t-interval, clipped to ``bounds``], three decimals."""
    values = np.asarray(values, dtype=float)
    low, high = np.clip(t_interval(values), *bounds)
    return f"{three_decimals(values.mean())} [{three_decimals(low)}, {three_decimals(high)}]"


def _at(measures: pd.DataFrame, step: int, condition: str = "base") -> pd.DataFrame:
    return measures[(measures.step == step) & (measures.condition == condition)]


@register_block(f"{STUDY}/retrofit-trained-summary")
def retrofit_trained_summary(results_dir: Path) -> str:
    """The page's one-line summary of §2c: the two rules' verdicts and the exploratory reading."""
    measures, rules = stage_measures(results_dir), _rules(results_dir)
    if rules is None or not rules.seeds:
        return f"- **A trained SmolLM2 retrofit (§2c)**: {NOT_YET}."
    last = DECISION_STEP
    sink = _at(measures, last)
    sink = sink[sink.seed.isin(rules.seeds)].sink
    return (
        f"- **A trained SmolLM2 retrofit (§2c): rule 1, each loop repeats SmolLM2's stages, {rules.stages}** "
        f"(alignment {_interval(rules.alignment, CORRELATION)} after {last} steps at {TRAIN_LOOPS} loops, "
        f"{len(rules.seeds)} seeds from one initialisation); rule 2, the largest prelude/core MLP (layer "
        f"{', '.join(map(str, rules.zeroed))}) is their precondition, {rules.precondition} (amplitude after / "
        f"before zeroing it {_interval(rules.ratios['zero_massive'], RATIO)}), a test of a precondition of "
        f"stages {ABSENT.get(rules.stages, 'rule 1 found')}. Exploratory: training grows the "
        f"sink (max sink mass {three_decimals(_at(measures, 0).sink.iloc[0])} → {span(sink, 3)}) and each loop's "
        f"alignment with the layers it was cut from ({three_decimals(rules.core_untrained)} → "
        f"{three_decimals(rules.core_trained.mean())})."
    )


@register_block(f"{STUDY}/retrofit-trained-says-loss")
def retrofit_trained_says_loss(results_dir: Path) -> str:
    """Held-out loss by loops at step 0 and at the decision step, and rule 0's count (a description)."""
    losses, rules = _seed_files(results_dir, "losses.csv"), _rules(results_dir)
    if rules is None:
        return NOT_YET
    last = losses[losses.step == DECISION_STEP].groupby("loops").val_loss
    start = losses[losses.step == 0].groupby("loops").val_loss
    at = ", ".join(f"{loops} loop{'s' * (loops > 1)} {span(part, 2)}" for loops, part in last)
    return (
        f"Held-out loss (nats) at the training depth, {TRAIN_LOOPS} loops: {span(start.get_group(TRAIN_LOOPS), 2)} at "
        f"step 0 and {span(last.get_group(TRAIN_LOOPS), 2)} at step {DECISION_STEP}; rule 0 counts "
        f"{len(rules.learned)} of {rules.read} seeds learned. At step {DECISION_STEP}, by loops: {at}."
    )


@register_block(f"{STUDY}/retrofit-trained-says-stages")
def retrofit_trained_says_stages(results_dir: Path) -> str:
    """Rule 1 said, with the untrained alignment, and the amplitude and sink before and after training."""
    measures, rules = stage_measures(results_dir), _rules(results_dir)
    if rules is None or not rules.seeds:
        return NOT_YET
    trained = _at(measures, DECISION_STEP)
    trained = trained[trained.seed.isin(rules.seeds)]
    reference = pd.read_csv(results_dir / STUDY / RETROFIT_FILE)
    own = reference[(reference.model == "feedforward") & (reference.condition == "base")]
    smollm2 = own.sink_mass.max() if "sink_mass" in own else np.nan
    start = _at(measures, 0)
    return (
        f"**Each loop repeats SmolLM2's stages (rule 1): {rules.stages}.** Alignment at step {DECISION_STEP} "
        f"{_interval(rules.alignment, CORRELATION)} ({len(rules.seeds)} seeds); untrained "
        f"{span(start.alignment, 3)}; change {_interval(rules.change, CHANGE)}. Described beside it: amplitude "
        f"{span(start.amplitude, 3)} untrained, {span(trained.amplitude, 3)} at step {DECISION_STEP}; max sink mass "
        f"{span(start.sink, 3)} untrained, {span(trained.sink, 3)} at step {DECISION_STEP} (SmolLM2 itself "
        f"{three_decimals(smollm2)})."
    )


@register_block(f"{STUDY}/retrofit-trained-says-mlp")
def retrofit_trained_says_mlp(results_dir: Path) -> str:
    """Rule 2 said, what it can test given rule 1, which MLP it zeroed, and where the largest outputs are."""
    measures, rules = stage_measures(results_dir), _rules(results_dir)
    if rules is None or not rules.seeds:
        return NOT_YET
    zeroed = measures[measures.condition == "zero_massive"]
    layers = sorted({int(layer) for layer in zeroed.zeroed_layer})
    mlps = _seed_files(results_dir, "mlps.csv")
    mean = mlps.groupby(["step", "layer"]).max_abs_output.mean()
    at_last = mean.loc[DECISION_STEP] if DECISION_STEP in mean.index.get_level_values("step") else pd.Series()
    largest = at_last.get(layers[0], np.nan) if len(layers) == 1 else np.nan
    first = int(mean.index.get_level_values("step").min())
    top = mean.loc[first].sort_values(ascending=False).head(3)
    reference = pd.read_csv(results_dir / STUDY / RETROFIT_FILE)
    own = reference[(reference.model == "feedforward") & (reference.condition == "zero_massive")]
    own = own.get("zeroed_layer", pd.Series(dtype=float)).dropna()
    own_layer = int(own.iloc[0]) if len(own) else None
    kept = set(mlps.layer.astype(int))
    text = (
        f"**The largest prelude/core MLP is the precondition (rule 2): {rules.precondition}.** The MLP the rule "
        f"zeroes is at layer {', '.join(map(str, layers))} in all {len(zeroed)} reads ({zeroed.seed.nunique()} "
        f"seeds × {zeroed.step.nunique()} steps; max |output| {largest:.1f} at step {DECISION_STEP}, mean over "
        f"seeds); amplitude after / before zeroing it {_interval(rules.ratios['zero_massive'], RATIO)}, the "
        f"smallest MLP zeroed {_interval(rules.ratios['zero_control'], RATIO)}."
    )
    if rules.stages in ABSENT:
        text += (
            f' Rule 1 reads "{rules.stages}", so rule 2 tests a precondition of stages {ABSENT[rules.stages]}: '
            f"its verdict says whether zeroing that MLP halves the loops' ColSum amplitude, not what holds stages up."
        )
    if own_layer is not None:
        where = "a layer the retrofit drops" if own_layer not in kept else "a layer the retrofit keeps"
        text += f" SmolLM2's own largest MLP output is at layer {own_layer} (§2), {where}."
    return (
        f"{text} The retrofit's largest outputs {'untrained' if first == 0 else f'at step {first}'}: "
        f"{', '.join(f'layer {int(layer)} {value:.1f}' for layer, value in top.items())} (mean over seeds)."
    )


@register_block(f"{STUDY}/retrofit-trained-says-seeds")
def retrofit_trained_says_seeds(results_dir: Path) -> str:
    """What the seeds vary: whether step 0 is one model for every seed, and the wall time (a description)."""
    measures, losses = stage_measures(results_dir), _seed_files(results_dir, "losses.csv")
    if measures.empty:
        return NOT_YET
    train = _seed_files(results_dir, "train.csv")
    start = measures[measures.step == 0].drop(columns="seed").round(12)
    seeds = measures.seed.nunique()
    same_stages = len(start.drop_duplicates()) == len(start) // seeds
    first = losses[losses.step == 0].drop(columns="seed").round(12)
    same = same_stages and len(first.drop_duplicates()) == len(first) // seeds
    shared = (
        f"step 0 reads the same at all {seeds} seeds (held-out losses and every stage measure): the seeds share "
        f"one initialisation and differ only in the training passages they draw (the data and its order)"
        if same
        else f"step 0 differs between the {seeds} seeds"
    )
    wall = train.groupby("seed").seconds.max()
    return f"What a seed varies (a description): {shared}. Wall time {span(wall, 0)} s per seed on one thread."
