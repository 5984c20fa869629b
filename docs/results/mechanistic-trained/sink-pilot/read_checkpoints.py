"""Exploratory sink pilot (docs/results/mechanistic.md §1b): every checkpoint of the given runs read as the
trained-model study reads a run (16 held-out windows of 128 bytes from the run's seed), one CSV row each.

    python docs/results/mechanistic-trained/sink-pilot/read_checkpoints.py RUN_DIR... > pilot.csv

Columns: the run's preset and seed, the checkpoint's step and the training loss logged there; the largest
and mean attention mass on the start token over (loop, layer); the ColSum amplitude (max − min over a loop's
layers, mean over loops); the largest residual activation; the MLP with the largest output and its value.
"""

import csv
import json
import sys
from pathlib import Path

import torch

from looplab.analysis.colsum import colsum_trace
from looplab.analysis.massive import mlp_output_max
from looplab.analysis.stages import sink_mass, top_activation
from looplab.checkpoint import load_weights
from looplab.experiment import Experiment
from looplab.model.trace import trace
from looplab.seeding import derive_generator
from looplab.studies.mechanistic.traces import WINDOW_BYTES, WINDOWS
from looplab.studies.mechanistic.trained import STUDY
from looplab.text.evaluate import training_depth


def checkpoint_rows(run: Path) -> list[dict]:
    exp = Experiment.from_run(run)
    model, depth, seed = exp.model, training_depth(exp), exp.config.run.seed
    tokens, _ = exp.task.sample_split(WINDOW_BYTES, WINDOWS, derive_generator(seed, STUDY), "val")
    valid = torch.ones_like(tokens, dtype=torch.bool)
    logged = {r["step"]: r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())}
    rows = []
    for checkpoint in sorted((run / "checkpoints").iterdir()):
        step = int(checkpoint.name.split("_")[1])
        load_weights(checkpoint, {"model": model})
        model.eval()
        with torch.no_grad():
            recorded = trace(model, tokens, valid, depth, attention=True)
            sink = sink_mass(recorded.attention(), valid).mean((-1, -2))  # [loops, layers]
            colsum = colsum_trace(recorded).mean(-1)
            largest = mlp_output_max(model, lambda: model(tokens, valid, depth), valid)
        name = max(largest, key=largest.get)
        rows.append(
            {
                "preset": "kjv-looped" if depth > 1 else "kjv-feedforward",
                "seed": seed,
                "step": step,
                "train_loss": round(logged.get(step, float("nan")), 4),
                "sink_max": round(float(sink.max()), 4),
                "sink_mean": round(float(sink.mean()), 4),
                "colsum_amplitude": round(float((colsum.max(-1).values - colsum.min(-1).values).mean()), 4),
                "top_activation": round(float(top_activation(recorded.states(), valid).max()), 2),
                "largest_mlp": name,
                "largest_mlp_max": round(largest[name], 2),
            }
        )
    return rows


if __name__ == "__main__":
    torch.set_num_threads(1)
    rows = [row for run in sys.argv[1:] for row in checkpoint_rows(Path(run))]
    writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
