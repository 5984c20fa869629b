"""Scripting looplab from Python: train, evaluate, and take a trained model apart.

Trains a small RL-Halting model on binary addition, evaluates it, then uses
the public API a script reaches for:

- ``eval/samples.parquet``: one row per evaluated instance, and a metric of
  summary.json recomputed from it;
- ``eval_batches``: the very instances the evaluation scored;
- ``RLHalting.sample`` / ``.distribution``: each row's τ, log π(τ) and π;
- ``jsrr_per_sample``: the Jacobian penalty per sample, along a direction we choose;
- ``Task.show``: an instance, its answer and the model's answer in words;
- ``trace``: the residual state of every (loop, layer), by name.

    python -m looplab.examples.scripting --out runs/scripting
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from looplab.config import load_config
from looplab.eval.grid import eval_batches
from looplab.eval.run import evaluate_run
from looplab.model.protocol import LoopProbe
from looplab.model.trace import trace
from looplab.stability.jacobian import jsrr_per_sample, random_direction
from looplab.train.trainer import train


def main(out: Path, steps: int = 400) -> dict:
    """Run the walk-through in ``out``; returns the numbers it prints."""
    config = load_config(
        "demo",
        [
            "schedule.name=rl_halting",
            "schedule.t_max=12",
            f"train.steps={steps}",
            "train.checkpoint_every=200",
            "eval.samples=64",
            "eval.max_loops=16",
        ],
    )
    run_dir = out / "run"
    exp = train(config, run_dir, progress=False)  # resumes if run_dir already holds this run
    summary = evaluate_run(run_dir)

    # Every summary number can be recomputed from the per-sample file.
    samples = pd.read_parquet(run_dir / "eval" / "samples.parquet")
    ood = samples[samples.length > config.task.train_max]
    at_policy = ood.apply(lambda row: row.correct[row.policy_depth - 1], axis=1)
    policy_ood = float(at_policy.groupby(ood.length).mean().mean())
    print(f"Policy OOD from summary.json {summary['policy_ood']:.4f}, from samples.parquet {policy_ood:.4f}")

    # The evaluated instances themselves: sample 0 of length 12.
    batch = next(eval_batches(exp.task, 12, 4, config.eval.batch_size, config.run.seed))
    assert samples[(samples.length == 12)].iloc[0]["sample"] == 0

    # RL-Halting's draws for these rows, and their whole halting distribution.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        drawn = exp.schedule.sample(exp.model, batch, generator)
        log_pi = exp.schedule.distribution(exp.model, batch)
    print(
        f"tau {drawn.depth.tolist()}, log pi(tau) {[round(v, 2) for v in drawn.log_prob.tolist()]}, "
        f"argmax pi {(log_pi.argmax(1) + 1).tolist()}"
    )

    # The Jacobian penalty at each row's state h_tau, along a direction of our choosing.
    probe = LoopProbe(drawn.states.detach(), drawn.e.detach(), batch.valid)
    direction = random_direction(batch.valid, config.model.d_model, torch.Generator().manual_seed(1))
    penalty = jsrr_per_sample(exp.model, probe, "jvp", power_iters=3, direction=direction)
    print(f"||J v||^2 per sample after 3 power iterations: {[round(v, 3) for v in penalty.tolist()]}")

    # One instance in words, with the model's answer at its policy depth.
    depth = int(log_pi.argmax(1)[0]) + 1
    with torch.no_grad():
        prediction = exp.model(batch.tokens, batch.valid, depth).argmax(-1)[0]
    print(exp.task.show(batch, 0, prediction))

    # The residual state after core layer 1 in loop 3, by name.
    recorded = trace(exp.model, batch.tokens, batch.valid, loops=6)
    state = recorded["loop03.core1.resid"]
    print(f"trace: {len(recorded.names())} entries; loop03.core1.resid {tuple(state.shape)}")
    return {
        "policy_ood_summary": summary["policy_ood"],
        "policy_ood_samples": policy_ood,
        "depth": drawn.depth,
        "log_prob": drawn.log_prob,
        "log_pi": log_pi,
        "penalty": penalty,
        "trace_names": recorded.names(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scripting"))
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    main(args.out, args.steps)
