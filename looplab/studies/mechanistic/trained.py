"""Stages of inference in trained looped models (docs/results/mechanistic-trained/PROTOCOL.md): the blocks.

The collector (:mod:`looplab.studies.mechanistic.traces`) traces every trained run of the sweep on
the same 16 held-out windows and writes three per-seed files under
``docs/results/mechanistic-trained/``:

    layers.csv       arm, seed, condition, loop, layer: ColSum concentration, sink mass, top
                     activation, massive ratio (condition: ``base``, ``zero_massive`` — the MLP with
                     the largest output zeroed — or ``zero_control`` — the one with the smallest)
    runs.csv         arm, seed: the two zeroed MLPs and their output maxima, Δ_128, the distance to
                     the 128-loop state at 4 / 32 / 64 / 127 loops, the final training loss
    reuse.csv        arm, seed, epsilon (0: no reuse), loops: validation loss, share of patterns reused
                     (the feed-forward control at ε = 0 only: it was trained for one pass)

The blocks derive stage alignment and amplitude from layers.csv (the feed-forward reference is
the mean of the feed-forward seeds), so every number on the page is recomputable from the CSVs.
Decision rules, stated in the protocol before any run (Student-t / Welch 95 % intervals):

    stages match the feed-forward ones   looped alignment                    "holds" above 0
    massive activations needed           looped amplitude after / before     "holds" below 0.5
    sandwich blocks the stages           amplitude looped − looped-sandwich  "holds" above 0
    injection needed to converge         log10 Δ_128 looped-noinject − looped "holds" above 0
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from looplab.report.aggregate import t_interval
from looplab.report.effect import welch_interval
from looplab.report.pages import markdown_table, register_block, register_frozen
from looplab.studies.mechanistic.cells import few_seeds, interval_verdict, mean_cell, three_decimals

STUDY = "mechanistic-trained"
ARM_ORDER = ("looped", "looped-noinject", "looped-sandwich", "feedforward")
REFERENCE_ARM = "feedforward"
LONG_LOOPS = 128
EPSILONS = (0.0, 0.01, 0.05)  # attention reuse thresholds (0: no reuse, the exact model)
DISTANCE_LOOPS = (4, 32, 64, 127)
READ_LOOPS = (4, 32, 128)
CONVERGED = 1e-3  # Δ_128 below this counts a seed as converged (reported, deciding nothing)
HALVED = 0.5
CORRELATION = (-1.0, 1.0)  # the range a stage alignment's interval is clipped to
CONDITIONS = ("base", "zero_massive", "zero_control")
LAYERS_FILE, RUNS_FILE, REUSE_FILE = "layers.csv", "runs.csv", "reuse.csv"
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


def arm_rank(arm: str) -> tuple[int, str]:
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


# ---------------------------------------------------------------------------------------------- derived measures


def stage_table(layers: pd.DataFrame, condition: str = "base") -> pd.DataFrame:
    """Per (arm, seed): stage alignment and amplitude (docs/methods.md §7) under ``condition``.

    A looped seed's curves are its loops' core-layer ColSum; a feed-forward seed's one curve is its core
    resampled to the looped models' layer count, held against the mean of the *other* feed-forward seeds.
    """
    from looplab.analysis.stages import block_means, stage_alignment, stage_amplitude

    part = layers[layers.condition == condition]
    reference_all = _curves(layers[(layers.condition == "base") & (layers.arm == REFERENCE_ARM)])
    looped_layers = (
        int(part.loc[part.arm != REFERENCE_ARM, "layer"].max()) + 1 if (part.arm != REFERENCE_ARM).any() else 4
    )
    rows = []
    for (arm, seed), run in part.groupby(["arm", "seed"], sort=False):
        curves = _curves(run)[seed]  # [loops, layers]
        if arm == REFERENCE_ARM:
            others = [curve[0] for other, curve in reference_all.items() if other != seed]
            if not others:
                continue
            reference = torch.stack(others).mean(0)
            curves = block_means(curves, looped_layers)
        else:
            reference = torch.stack([curve[0] for curve in reference_all.values()]).mean(0)
        rows.append(
            {
                "arm": arm,
                "seed": seed,
                "alignment": float(np.nanmean(stage_alignment(curves, reference).numpy())),
                "amplitude": float(stage_amplitude(curves).mean()),
            }
        )
    return pd.DataFrame(rows, columns=["arm", "seed", "alignment", "amplitude"])


def _curves(part: pd.DataFrame) -> dict[int, torch.Tensor]:
    """seed → its ColSum curves [loops, layers] (float64)."""
    return {int(seed): colsum_curves(run) for seed, run in part.groupby("seed")}


def colsum_curves(rows: pd.DataFrame) -> torch.Tensor:
    """The ColSum curves [loops, layers] (float64) of one traced pass's rows (loop, layer, colsum)."""
    table = rows.pivot(index="loop", columns="layer", values="colsum").sort_index()
    return torch.tensor(table.to_numpy(), dtype=torch.float64)


def decision_lines(layers: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The protocol's four decisions, each with its interval, seed counts and verdict."""
    base, zeroed = stage_table(layers), stage_table(layers, "zero_massive")
    lines = []

    looped = base.loc[base.arm == "looped", "alignment"].dropna().to_numpy()
    if len(looped) >= 2:
        low, high = np.clip(t_interval(looped), *CORRELATION)
        lines.append(
            f"Stages repeat and match the feed-forward ones: looped alignment {looped.mean():.3f}, 95% "
            f"[{low:.3f}, {high:.3f}] ({len(looped)} seeds){few_seeds(len(looped))}: "
            f"{interval_verdict(low, high, 0.0, True)}"
        )
    else:
        lines.append(f"Stages repeat and match the feed-forward ones: n/a ({len(looped)} seeds; needs 2)")

    paired = base.merge(zeroed, on=["arm", "seed"], suffixes=("", "_zeroed"))
    looped_pairs = paired[paired.arm == "looped"]
    ratio = (looped_pairs.amplitude_zeroed.astype(float) / looped_pairs.amplitude.astype(float)).dropna().to_numpy()
    if len(ratio) >= 2:
        low, high = t_interval(ratio)
        lines.append(
            f"Massive activations are the precondition: looped amplitude after / before zeroing the largest MLP "
            f"{ratio.mean():.3f}, 95% [{low:.3f}, {high:.3f}] ({len(ratio)} seeds){few_seeds(len(ratio))}: "
            f"{interval_verdict(low, high, HALVED, False)}"
        )
    else:
        lines.append(f"Massive activations are the precondition: n/a ({len(ratio)} seeds; needs 2)")

    lines.append(
        _difference_line(
            "Sandwich blocks the stages: amplitude",
            base.loc[base.arm == "looped", "amplitude"],
            base.loc[base.arm == "looped-sandwich", "amplitude"],
            "looped − looped-sandwich",
        )
    )
    done = runs[runs.status == "done"]
    lines.append(
        _difference_line(
            "Injection is needed to converge at 128 loops: log10 Δ_128",
            np.log10(done.loc[done.arm == "looped-noinject", "delta_128"].astype(float)),
            np.log10(done.loc[done.arm == "looped", "delta_128"].astype(float)),
            "looped-noinject − looped",
        )
    )
    return lines


def _difference_line(question: str, a, b, label: str) -> str:
    a, b = np.asarray(pd.Series(a, dtype=float).dropna()), np.asarray(pd.Series(b, dtype=float).dropna())
    if len(a) < 2 or len(b) < 2:
        return f"{question}, {label}: n/a ({len(a)} and {len(b)} seeds; needs 2 each)"
    low, high = welch_interval(a, b)
    return (
        f"{question}, {label} {a.mean() - b.mean():+.3f}, Welch 95% [{low:+.3f}, {high:+.3f}] "
        f"({len(a)} vs {len(b)} seeds){few_seeds(min(len(a), len(b)))}: {interval_verdict(low, high, 0.0, True)}"
    )


def _read(results_dir: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(results_dir / STUDY / name)


@register_block(f"{STUDY}/decisions")
def decisions_block(results_dir: Path) -> str:
    """The protocol's four decisions, one line each."""
    return "\n".join(
        f"- {line}" for line in decision_lines(_read(results_dir, LAYERS_FILE), _read(results_dir, RUNS_FILE))
    )


@register_block(f"{STUDY}/arms")
def arms_block(results_dir: Path) -> str:
    """Per arm: stage alignment and amplitude, sink mass, top activation, Δ_128 and the converged seeds, loss."""
    layers, runs, reuse = (_read(results_dir, name) for name in (LAYERS_FILE, RUNS_FILE, REUSE_FILE))
    stages = stage_table(layers)
    base = layers[layers.condition == "base"].groupby(["arm", "seed"])[["sink_mass", "top_activation"]].max()
    loss = reuse[(reuse.epsilon == 0) & (reuse.loops == 4)].set_index(["arm", "seed"]).loss
    body = []
    for arm in sorted(set(runs.arm), key=arm_rank):
        part = runs[(runs.arm == arm) & (runs.status == "done")]
        delta = part.delta_128.astype(float)
        by_seed = base.loc[arm] if arm in base.index.get_level_values(0) else pd.DataFrame()
        body.append(
            [
                arm,
                f"{len(part)}{few_seeds(len(part))}",
                mean_cell(stages.loc[stages.arm == arm, "alignment"], bounds=CORRELATION),
                mean_cell(stages.loc[stages.arm == arm, "amplitude"], bounds=(0.0, 1.0)),
                mean_cell(by_seed.get("sink_mass", []), bounds=(0.0, 1.0)),
                mean_cell(by_seed.get("top_activation", []), 1, (0.0, math.inf)),
                _log_delta_cell(delta),
                f"{int((delta < CONVERGED).sum())} of {len(delta)}",
                mean_cell(loss.get(arm, pd.Series(dtype=float)), 3, (0.0, math.inf)),
            ]
        )
    header = [
        "arm",
        "seeds",
        "stage alignment",
        "stage amplitude",
        "max sink mass",
        "max top activation",
        "log10 Δ_128",
        f"Δ_128 < {CONVERGED:g}",
        "val loss, 4 loops (nats)",
    ]
    return markdown_table(header, body)


@register_block(f"{STUDY}/seeds")
def seeds_block(results_dir: Path) -> str:
    """Alignment and amplitude per model and seed, before and after zeroing the largest and the smallest MLP."""
    layers, runs = _read(results_dir, LAYERS_FILE), _read(results_dir, RUNS_FILE)
    tables = {condition: stage_table(layers, condition).set_index(["arm", "seed"]) for condition in CONDITIONS}
    body = []
    for _, run in runs[runs.status == "done"].iterrows():
        key = (run.arm, run.seed)
        cells = [run.arm, str(run.seed), f"{run.massive_mlp} ({run.massive_mlp_max:.1f})"]
        for condition in CONDITIONS:
            row = tables[condition].loc[key] if key in tables[condition].index else None
            cells.append("n/a" if row is None else f"{three_decimals(row.alignment)} / {three_decimals(row.amplitude)}")
        cells.append(f"{run.control_mlp} ({run.control_mlp_max:.2f})")
        body.append(cells)
    header = [
        "arm",
        "seed",
        "largest MLP (its max abs. output)",
        "alignment / amplitude",
        "largest MLP zeroed",
        "smallest MLP zeroed",
        "smallest MLP (its max abs. output)",
    ]
    return markdown_table(header, body)


def _log_delta_cell(delta: pd.Series) -> str:
    """log10 Δ_128 over seeds; a seed at an exact fixed point (Δ = 0, log −∞) is counted, not averaged."""
    exact = int((delta == 0).sum())
    if not exact:
        return mean_cell(np.log10(delta), 2)
    rest = delta[delta > 0]
    return f"Δ = 0 exactly in {exact} of {len(delta)}" + (
        f"; others {mean_cell(np.log10(rest), 2)}" if len(rest) else ""
    )


@register_block(f"{STUDY}/reuse")
def reuse_block(results_dir: Path) -> str:
    """Per looped arm, ε and loop count: the share of attention patterns reused (seed mean) and the loss change
    it costs (reused − exact, mean ± std [t-interval] over seeds)."""
    reuse = _read(results_dir, REUSE_FILE)
    exact = reuse[reuse.epsilon == 0].set_index(["arm", "seed", "loops"]).loss
    body = []
    for arm in [a for a in ARM_ORDER if a in set(reuse.loc[reuse.epsilon > 0, "arm"])]:
        for epsilon in EPSILONS[1:]:
            cells = [arm, f"{epsilon:g}"]
            for loops in READ_LOOPS:
                part = reuse[(reuse.arm == arm) & (reuse.epsilon == epsilon) & (reuse.loops == loops)]
                change = part.loss.to_numpy() - exact.loc[list(zip(part.arm, part.seed, part.loops))].to_numpy()
                cells.append(f"{100 * part.reused_share.mean():.1f} % / {mean_cell(change, 4)}")
            body.append(cells)
    header = ["arm", "ε", *(f"{k} loops: reused / Δ loss (nats)" for k in READ_LOOPS)]
    return markdown_table(header, body)


RETROFIT_FILE = "retrofit_stages.csv"


@register_block(f"{STUDY}/retrofit")
def retrofit_block(results_dir: Path) -> str:
    """SmolLM2 and its (4, 6⊗4, 4) retrofit: stage alignment with SmolLM2's own curve and amplitude, per
    zeroed MLP (rows from ``python -m looplab.studies.mechanistic.smollm2_stages``; one model, so no seed spread)."""
    from looplab.analysis.stages import block_means, stage_alignment, stage_amplitude

    rows = _read(results_dir, RETROFIT_FILE)
    reference_rows = rows[(rows.model == "feedforward") & (rows.condition == "base")]
    reference = torch.tensor(reference_rows.sort_values("layer").colsum.to_numpy(), dtype=torch.float64)
    looped_layers = int(rows.loc[rows.model != "feedforward", "layer"].max()) + 1
    body = []
    for (model, condition), part in rows.groupby(["model", "condition"], sort=False):
        curves = colsum_curves(part)
        if model == "feedforward":
            curves = block_means(curves, looped_layers)
        zeroed = part.zeroed_layer.iloc[0]
        body.append(
            [
                model,
                condition,
                "–" if pd.isna(zeroed) else f"layer {int(zeroed)}",
                three_decimals(float(np.nanmean(stage_alignment(curves, reference).numpy()))),
                three_decimals(float(stage_amplitude(curves).mean())),
                three_decimals(float(part.sink_mass.max())),
            ]
        )
    return markdown_table(
        ["model", "condition", "MLP zeroed", "stage alignment", "stage amplitude", "max sink mass"], body
    )


@register_block(f"{STUDY}/paper-models")
def paper_models_block(results_dir: Path) -> str:
    """The paper's own table of models (as printed), for the comparison beside ours."""
    from looplab.report.comparison import PAPER_TABLES_DIR, read_paper_table

    table, notes = read_paper_table("mechanistic_models.csv", PAPER_TABLES_DIR)
    if table is None:
        return "\n".join(notes)
    columns = [
        "model",
        "prelude",
        "core",
        "coda",
        "input_injection",
        "train_loops",
        "limit_behaviour_128_loops",
        "stages",
    ]
    return markdown_table(columns, table[columns].astype(str).values.tolist())
