"""What the data say in docs/results/mechanistic.md §1 and §2b, generated: the trained-model study's rules said as
sentences (:func:`looplab.studies.prose.said`, with Holm's verdict where it differs) and descriptions of the
committed per-seed rows (spans, seed means, counts). The page's hand-written interpretation beside each block
is marked as such.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from looplab.report.pages import markdown_table, register_block
from looplab.studies.mechanistic.trained import (
    DISTANCE_LOOPS,
    LAYERS_FILE,
    READ_LOOPS,
    RETROFIT_FILE,
    REUSE_FILE,
    RUNS_FILE,
    STUDY,
    _read,
    colsum_curves,
    stage_table,
)
from looplab.studies.mechanistic.verdicts import decisions
from looplab.studies.prose import said, span

LOOPED = ("looped", "looped-noinject", "looped-sandwich")


def _said(results_dir: Path, index: int) -> str:
    """Rule ``index`` (0-based) said, with Holm's verdict over the four where it differs."""
    found = decisions(results_dir)
    d = found[index]
    text = said(d.line)
    if d.holm_verdict != d.verdict:
        text += f" After Holm over the {len(found)} decisions: {d.holm_verdict}."
    return text


def smollm2_reference(results_dir: Path) -> tuple[float, float]:
    """SmolLM2's own largest sink mass and stage amplitude (its curve resampled to the retrofit's core)."""
    from looplab.analysis.stages import block_means, stage_amplitude

    rows = _read(results_dir, RETROFIT_FILE)
    base = rows[(rows.model == "feedforward") & (rows.condition == "base")]
    layers = int(rows.loc[rows.model != "feedforward", "layer"].max()) + 1
    amplitude = float(stage_amplitude(block_means(colsum_curves(base), layers)).mean())
    return float(base.sink_mass.max()), amplitude


def _seed_mean(stages: pd.DataFrame, arm: str, column: str) -> float:
    return float(stages.loc[stages.arm == arm, column].mean())


@register_block(f"{STUDY}/says-stages")
def says_stages(results_dir: Path) -> str:
    """Whether the trained runs have the precondition the stage claims name, and rules 1–3 said."""
    layers, runs = _read(results_dir, LAYERS_FILE), _read(results_dir, RUNS_FILE)
    done = runs[runs.status == "done"]
    base = layers[layers.condition == "base"].groupby(["arm", "seed"])[["sink_mass", "top_activation"]].max()
    stages = stage_table(layers)
    sink, amplitude = smollm2_reference(results_dir)
    activation = base.groupby("arm").top_activation.mean()
    return (
        f"Over the {len(done)} trained runs (a description): the largest attention mass on the start token over "
        f"(loop, layer) is {span(base.sink_mass, 0, 100)} % (SmolLM2: {100 * sink:.0f} %); the largest MLP output "
        f"{span(done.massive_mlp_max, 1)}, the largest residual activation {span(base.top_activation, 1)}; the stage "
        f"amplitude {span(stages.amplitude, 3)} (SmolLM2's feed-forward curve: {amplitude:.3f}). Stage alignment, "
        f"seed means: feedforward against its other seeds {_seed_mean(stages, 'feedforward', 'alignment'):.3f}, "
        + ", ".join(f"{arm} {_seed_mean(stages, arm, 'alignment'):.3f}" for arm in LOOPED)
        + ". Largest activation, seed means: "
        + ", ".join(f"{arm} {activation[arm]:.1f}" for arm in (*LOOPED, "feedforward"))
        + f". {_said(results_dir, 0)} {_said(results_dir, 1)} {_said(results_dir, 2)}"
    )


@register_block(f"{STUDY}/says-convergence")
def says_convergence(results_dir: Path) -> str:
    """Rule 4 said; Δ_128, the distance to the 128-loop state and the validation loss by loops, per arm."""
    runs, reuse = _read(results_dir, RUNS_FILE), _read(results_dir, REUSE_FILE)
    done = runs[runs.status == "done"]
    exact = reuse[reuse.epsilon == 0]
    parts = []
    for arm in (*LOOPED, "feedforward"):
        part = done[done.arm == arm]
        delta = part.delta_128.astype(float)
        zero = int((delta == 0).sum())
        delta_words = f"Δ_128 = 0 exactly in {zero} of {len(delta)} seeds" if zero else f"Δ_128 {span(delta, 4)}"
        distances = " / ".join(f"{part[f'distance_{k}'].mean():.2f}" for k in DISTANCE_LOOPS[:3])
        loss = exact[exact.arm == arm].groupby("loops").loss.mean()
        losses = " / ".join(f"{loss[k]:.3f}" for k in READ_LOOPS if k in loss.index)
        parts.append(
            f"{arm}: {delta_words}; distance to the 128-loop state {distances} at loops "
            f"{' / '.join(map(str, DISTANCE_LOOPS[:3]))}"
            + (
                f"; validation loss {losses} nats at {' / '.join(str(k) for k in READ_LOOPS if k in loss.index)} loops"
                if len(loss)
                else ""
            )  # fmt: skip
        )
    return f"{_said(results_dir, 3)} Seed means (a description): {'; '.join(parts)}."


@register_block(f"{STUDY}/says-reuse")
def says_reuse(results_dir: Path) -> str:
    """Attention reuse per arm and ε: the share reused and the loss change, at the training depth and past it."""
    reuse = _read(results_dir, REUSE_FILE)
    exact = reuse[reuse.epsilon == 0].set_index(["arm", "seed", "loops"]).loss
    shown = reuse[reuse.epsilon > 0]
    first = min(READ_LOOPS)
    at_first = shown[(shown.loops == first) & (shown.epsilon == shown.epsilon.min())]
    parts = []
    for arm in [a for a in LOOPED if a in set(shown.arm)]:
        for epsilon in sorted(set(shown.epsilon)):
            cells = []
            for loops in READ_LOOPS[1:]:
                part = shown[(shown.arm == arm) & (shown.epsilon == epsilon) & (shown.loops == loops)]
                change = part.loss.to_numpy() - exact.loc[list(zip(part.arm, part.seed, part.loops))].to_numpy()
                cells.append(
                    f"{100 * part.reused_share.mean():.0f} % at {loops} loops (|Δ loss| ≤ {abs(change).max():.4f} "
                    "nats over seeds)"
                )
            parts.append(f"{arm}, ε = {epsilon:g}: {', '.join(cells)}")
    return (
        f"At ε = {shown.epsilon.min():g} and {first} loops (the training depth) the share reused is "
        f"{span(100 * at_first.reused_share, 1)} % in every arm. Past it (seed means, a description): "
        + "; ".join(parts)
        + "."
    )


# ----------------------------------------------------------------------------- §2: zeroing the largest MLP


@register_block(f"{STUDY}/says-zeroing")
def says_zeroing(results_dir: Path) -> str:
    """Where the frozen rule's largest MLP lies, and what zeroing it does in the feed-forward control."""
    layers, runs = _read(results_dir, LAYERS_FILE), _read(results_dir, RUNS_FILE)
    done = runs[runs.status == "done"]
    looped = done[done.arm.isin(LOOPED)]
    in_coda = int(looped.massive_mlp.str.startswith("coda").sum())
    ff = done[done.arm == "feedforward"]
    tables = {c: stage_table(layers, c).set_index(["arm", "seed"]) for c in ("base", "zero_massive", "zero_control")}

    def ff_alignment(condition: str) -> str:
        return span(tables[condition].loc["feedforward"].alignment, 2)

    amplitude = max(float(t.amplitude.max()) for t in tables.values())
    return (
        f"The frozen rule's largest MLP (among all MLPs) is a coda MLP in {in_coda} of {len(looped)} looped runs; in "
        f"the feed-forward control {', '.join(sorted(set(ff.massive_mlp)))} in {len(ff)} of {len(ff)}. Feed-forward "
        f"alignment with its other seeds (a description): intact {ff_alignment('base')}, largest MLP zeroed "
        f"{ff_alignment('zero_massive')}, smallest zeroed {ff_alignment('zero_control')}; stage amplitudes at most "
        f"{amplitude:.3f} in every run and condition."
    )


@register_block(f"{STUDY}/says-smollm2")
def says_smollm2(results_dir: Path) -> str:
    """SmolLM2 and its untrained retrofit, per zeroed MLP: the retrofit block's numbers said (one model each)."""
    from looplab.analysis.stages import block_means, stage_alignment, stage_amplitude

    rows = _read(results_dir, RETROFIT_FILE)
    reference_rows = rows[(rows.model == "feedforward") & (rows.condition == "base")]
    reference = torch.tensor(reference_rows.sort_values("layer").colsum.to_numpy(), dtype=torch.float64)
    layers = int(rows.loc[rows.model != "feedforward", "layer"].max()) + 1
    read = {}
    for (model, condition), part in rows.groupby(["model", "condition"], sort=False):
        curves = colsum_curves(part)
        if model == "feedforward":
            curves = block_means(curves, layers)
        zeroed = part.zeroed_layer.iloc[0]
        read[model, condition] = (
            float(np.nanmean(stage_alignment(curves, reference).numpy())),
            float(stage_amplitude(curves).mean()),
            float(part.sink_mass.max()),
            None if pd.isna(zeroed) else int(zeroed),
        )

    def words(model: str, condition: str) -> str:
        alignment, amplitude, sink, zeroed = read[model, condition]
        what = "intact" if zeroed is None else f"layer {zeroed}'s MLP zeroed"
        return f"{what}: alignment {alignment:.2f}, amplitude {amplitude:.2f}, sink {sink:.2f}"

    retrofits = [m for m in dict.fromkeys(m for m, _ in read) if m != "feedforward"]
    return (
        "One model each, no seed spread (a description). SmolLM2, "
        + "; ".join(words("feedforward", c) for c in ("base", "zero_massive", "zero_layer2"))
        + ". "
        + " ".join(
            f"{m}, " + "; ".join(words(m, c) for c in ("base", "zero_layer2", "zero_control") if (m, c) in read) + "."
            for m in retrofits
        )
    )


# ----------------------------------------------------------------------------- §1b: the sink pilot

PILOT_FILE = "sink-pilot/checkpoints.csv"
#: the share a uniform causal attention puts on the start token, averaged over a window's queries of 128 bytes
#: after the start token (129 positions): mean over q = 1..129 of 1 / q
UNIFORM_START = float(np.mean(1.0 / np.arange(1, 130)))


#: what each pilot preset is, as the table names it (configs/mechanistic/<preset>.toml: (p, k⊗r, c), injection)
PILOT_MODELS = {"kjv-feedforward": "feed-forward (2, 16⊗1, 2)", "kjv-looped": "looped (2, 4⊗4, 2), injection"}
#: the checkpoints the table shows: the first, the middle and the last of the 3000 steps
PILOT_STEPS = (500, 1500, 3000)


def _mlp_name(name: str) -> str:
    """ "prelude0" → "prelude 0": the part and the layer index of an MLP, as the page names it."""
    part = name.rstrip("0123456789")
    return f"{part} {name.removeprefix(part)}"


@register_block(f"{STUDY}/pilot")
def pilot_table(results_dir: Path) -> str:
    """The pilot's checkpoints at :data:`PILOT_STEPS`, per model: training loss, the largest attention mass on
    the start token, the largest MLP output (and which MLP), the largest residual activation."""
    rows = _read(results_dir, PILOT_FILE)
    body = []
    for preset, part in rows.groupby("preset", sort=False):
        shown = part.set_index("step").loc[list(PILOT_STEPS)]
        for i, (step, row) in enumerate(shown.iterrows()):
            body.append(
                [
                    PILOT_MODELS.get(preset, preset) if i == 0 else "",
                    str(step),
                    f"{row.train_loss:.3f}",
                    f"{row.sink_max:.3f}",
                    f"{row.largest_mlp_max:.1f} ({_mlp_name(row.largest_mlp)})",
                    f"{row.top_activation:.1f}",
                ]
            )
    header = ["model", "step", "train loss (nats)", "max sink mass", "largest MLP output", "largest activation"]
    return markdown_table(header, body)


@register_block(f"{STUDY}/says-pilot")
def says_pilot(results_dir: Path) -> str:
    """The exploratory pilot's checkpoints: loss, sink, largest MLP output, first and last checkpoint per model."""
    rows = _read(results_dir, PILOT_FILE).sort_values("step")
    parts = []
    for preset, part in rows.groupby("preset", sort=False):
        first, last = part.iloc[0], part.iloc[-1]
        late = part[part.step >= last.step - 1500]
        parts.append(
            f"{preset} (seed {first.seed}), step {first.step} → {last.step}: train loss {first.train_loss:.2f} → "
            f"{last.train_loss:.2f} nats, max sink mass {span(part.sink_max, 3)} over all checkpoints, largest MLP "
            f"output {first.largest_mlp_max:.1f} → {last.largest_mlp_max:.1f} "
            f"({span(late.largest_mlp_max, 1)} over the last 1500 steps)"
        )
    return (
        f"One seed per model, exploratory (a description): {'; '.join(parts)}. Uniform causal attention over 129 "
        f"positions would put {UNIFORM_START:.3f} on the start token."
    )


# ----------------------------------------------------------------------------- §3: the random-init grid


@register_block("mechanistic-grid/says")
def says_grid(results_dir: Path) -> str:
    """Per row of the random-init table: where its pattern holds on the grid, the axis values all its holding
    points share, its seeds at the shipped setting, and the attention bound's tightness (descriptions: the
    grid study has no decision rule)."""
    from looplab.studies.mechanistic import grid

    runs = pd.read_csv(results_dir / grid.STUDY / grid.RUNS_FILE)
    points, judged, paper = grid.point_table(runs), grid.seed_verdicts(runs), grid.paper_rows()
    shipped = judged[np.logical_and.reduce([np.isclose(judged[a], v) for a, v in grid.SHIPPED.items()])]
    lines = []
    for placement, injection in grid.ROW_ORDER:
        part = points[(points.placement == placement) & (points.injection == injection)]
        rows = judged[(judged.placement == placement) & (judged.injection == injection)]
        holding = part[part.holds]
        shared = [
            f"{axis} {holding[axis].iloc[0]:g}"
            for axis in grid.AXES
            if len(holding) and holding[axis].notna().all() and holding[axis].nunique() == 1
        ]
        at = shipped[(shipped.placement == placement) & (shipped.injection == injection)]
        low, high = grid.wilson(int(part.holds.sum()), len(part))
        counts = ", ".join(
            f"{int((at.met == met).sum())} {word}"
            for met, word in ((2, "hold"), (1, "partly"), (0, "no"))
            if (at.met == met).any()
        )
        lines.append(
            f"- {grid._label(placement, injection)} (paper: {paper[(placement, injection)]['verdict']}): holds at "
            f"{int(part.holds.sum())} of {len(part)} grid points (Wilson 95 % "
            f"[{100 * low:.0f}, {100 * high:.0f}] %), at least partly at {int(part.partly_holds.sum())} of {len(part)}"
            + (f"; all its holding points at {' and '.join(shared)}" if shared else "")
            + f". Over all its runs median self cosine {span(rows[grid.SELF], 3)}, min cross cosine "
            f"{span(rows[grid.CROSS], 3)}; at the shipped setting, of {len(at)} seeds: {counts} (min cross cosine "
            f"{span(at[grid.CROSS], 2)})."
        )
    bound = pd.read_csv(results_dir / grid.STUDY / grid.BOUND_FILE)
    lines.append(
        f"- The attention bound, {len(bound)} traced runs: it holds in {int((bound.holds_share == 1).sum())} of "
        f"{len(bound)}; the observed change is at most {bound.ratio_max.max():.4f} of the bound (medians "
        f"{span(bound.ratio_median, 4)}), {span(1 / bound.ratio_max, 0)}× below it at each run's largest."
    )
    return "\n".join(lines)
