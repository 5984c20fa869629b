"""The collector of the trained-stages study: every trained run traced on the same held-out windows, into
the per-seed CSVs :mod:`looplab.studies.mechanistic.trained` reads (the columns are listed there)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from looplab.report.pages import register_collector
from looplab.studies.mechanistic.trained import (
    DISTANCE_LOOPS,
    EPSILONS,
    LAYERS_FILE,
    LONG_LOOPS,
    READ_LOOPS,
    REUSE_FILE,
    RUNS_FILE,
    STUDY,
    arm_rank,
)

WINDOWS, WINDOW_BYTES = 16, 128


@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """Trace every finished run of ``sweep_dirs`` and write layers.csv, runs.csv and reuse.csv to ``out``."""
    from looplab.report.runs import read_results

    layers, runs, reuse = [], [], []
    for sweep_dir in sweep_dirs:
        for _, run in read_results(Path(sweep_dir)).iterrows():
            key = {"arm": str(run["variant"]), "seed": int(run["run.seed"])}
            run_dir = Path(sweep_dir) / "runs" / run["run_id"]
            if run.get("status") == "diverged":
                runs.append({**key, "status": "diverged"})
                continue
            measured = measure_run(run_dir)
            layers += [{**key, **row} for row in measured["layers"]]
            runs.append({**key, "status": "done", **measured["run"]})
            reuse += [{**key, **row} for row in measured["reuse"]]
    out.mkdir(parents=True, exist_ok=True)
    frames = {
        LAYERS_FILE: pd.DataFrame(layers),
        RUNS_FILE: pd.DataFrame(runs),
        REUSE_FILE: pd.DataFrame(reuse),
    }
    for name, frame in frames.items():
        frame = frame.sort_values(
            ["arm", "seed"], key=lambda c: c.map(arm_rank) if c.name == "arm" else c, kind="stable"
        )
        frame.round(6).to_csv(out / name, index=False)
    return frames[RUNS_FILE]


@torch.no_grad()
def measure_run(run_dir: Path) -> dict:
    """One trained run's rows: per (condition, loop, layer), the run's own columns, and per (ε, loops)."""
    from looplab.analysis.attention_reuse import AttentionReuse
    from looplab.analysis.colsum import colsum_trace
    from looplab.analysis.massive import massive_activations, mlp_output_max, zero_mlp
    from looplab.analysis.stages import distance_to_state, sink_mass, top_activation
    from looplab.experiment import Experiment
    from looplab.model.trace import trace
    from looplab.rundir import read_log
    from looplab.seeding import derive_generator
    from looplab.tasks import IGNORE
    from looplab.text.evaluate import training_depth

    exp = Experiment.from_run(run_dir)
    model, seed = exp.model, exp.config.run.seed
    depth = training_depth(exp)
    tokens, labels = exp.task.sample_split(WINDOW_BYTES, WINDOWS, derive_generator(seed, STUDY), "val")
    valid = torch.ones_like(tokens, dtype=torch.bool)

    def stage_rows(condition: str) -> list[dict]:
        recorded = trace(model, tokens, valid, depth, attention=True)
        colsum = colsum_trace(recorded).mean(-1)  # [loops, layers]
        sink = sink_mass(recorded.attention(), valid).mean((-1, -2))  # [loops, layers]
        top = top_activation(recorded.states(), valid)
        ratio = massive_activations(recorded.states(), valid)
        return [
            {
                "condition": condition,
                "loop": t + 1,
                "layer": layer,
                "colsum": float(colsum[t, layer]),
                "sink_mass": float(sink[t, layer]),
                "top_activation": float(top[t, layer]),
                "massive_ratio": float(ratio[t, layer]),
            }
            for t in range(colsum.shape[0])
            for layer in range(colsum.shape[1])
        ]

    largest = mlp_output_max(model, lambda: model(tokens, valid, depth), valid)
    massive_mlp, control_mlp = max(largest, key=largest.get), min(largest, key=largest.get)
    layer_rows = stage_rows("base")
    for condition, name in (("zero_massive", massive_mlp), ("zero_control", control_mlp)):
        with zero_mlp(model, name):
            layer_rows += stage_rows(condition)

    late = trace(model, tokens, valid, LONG_LOOPS, loop_indices=sorted({*DISTANCE_LOOPS, *READ_LOOPS, LONG_LOOPS}))
    states = late.states()  # [loops, layers, B, T, d]
    at = [late.loops.index(t) for t in DISTANCE_LOOPS]
    distance = distance_to_state(states[at], states[-1], valid)  # [len(DISTANCE_LOOPS), layers]
    steps = [record for record in read_log(run_dir) if "loss" in record]
    run_row = {
        "massive_mlp": massive_mlp,
        "massive_mlp_max": largest[massive_mlp],
        "control_mlp": control_mlp,
        "control_mlp_max": largest[control_mlp],
        "delta_128": float(distance[-1, -1]),
        **{f"distance_{t}": float(distance[i].mean()) for i, t in enumerate(DISTANCE_LOOPS)},
        "train_loss_final": steps[-1]["loss"] if steps else math.nan,
    }

    _, _, ctx = model.start(tokens, valid)

    def loss(h: torch.Tensor) -> float:
        logits = model.readout(h, ctx).double().flatten(0, 1)
        return float(torch.nn.functional.cross_entropy(logits, labels.flatten(), ignore_index=IGNORE))

    # ε = 0: the exact model, read from the 128-loop trace (its states are the model's own, bit for bit)
    reuse_rows = [
        {"epsilon": 0.0, "loops": t, "loss": loss(late[late.name(t)]), "reused_share": 0.0} for t in READ_LOOPS
    ]
    # the feed-forward control was trained for one pass: it has no loops to reuse attention across
    for epsilon in EPSILONS[1:] if depth > 1 else ():
        with AttentionReuse(model, valid, epsilon) as reuse:
            h, e, ctx = model.start(tokens, valid)
            for t in range(1, LONG_LOOPS + 1):
                h = model.step(h, e, ctx)
                if t in READ_LOOPS:
                    reuse_rows.append(
                        {"epsilon": epsilon, "loops": t, "loss": loss(h), "reused_share": reuse.reused_share}
                    )
    return {"layers": layer_rows, "run": run_row, "reuse": reuse_rows}
