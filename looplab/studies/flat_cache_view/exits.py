"""Exploratory, chosen after the study's reads: per-token exits through the flat cache on the study's runs.

    python -m looplab.studies.flat_cache_view.exits --runs runs/flat-cache-view [--threads 2]
                                                   [--out docs/results/flat-cache-view/exploratory-exits.csv]

The frozen protocol reads every token at one fixed depth. Once the ``shared`` cache was found free at a
fixed depth, the question a user asks next is whether it stays so when each token stops at its own loop
(a token that exited early is then read at that loop by every later one). This reads each trained run
(OUT/<arm>-<seed>) with the adaptive exits of ``bench/generate.py`` (:data:`EXITS`, cap 16) under
``per_loop`` and ``shared``, on the study's chain-trace problems and KJV passages: exact match, loops per
answer token, teacher-forced loss, loops per byte and the keys and values held. No rule decides it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.studies.flat_cache.run import study_inputs
from looplab.studies.flat_cache_view import protocol as P

EXITS_CSV = Path("docs/results/flat-cache-view/exploratory-exits.csv")
CAP = 16
#: (exit, its parameters): bench/generate.py's adaptive exits
EXITS = (("kl", {"eps": 0.01}), ("confidence", {"threshold": 0.9}))
CACHES = ("per_loop", "shared")


def read_exits(arm: str, seed: int, run_dir: Path) -> pd.DataFrame:
    """A row per (exit, cache) of one trained run: exact_match (%), answer_depth, loss (nats/byte), byte_depth,
    cache_mib."""
    from looplab.experiment import Experiment
    from looplab.generation import DecodeOptions, GenerationExit, score
    from looplab.generation.reasoning import decode_answers

    exp = Experiment.from_run(run_dir)
    problems, passages = study_inputs(exp)
    rows = []
    for name, params in EXITS:
        rule = GenerationExit(name, CAP, params)
        for cache in CACHES:
            answers = decode_answers(exp.model, problems, DecodeOptions(rule, cache))
            scored = score(exp.model, passages, DecodeOptions(rule, cache))
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "exit": name,
                    "cache": cache,
                    "exact_match": 100 * answers.exact_match,
                    "answer_depth": answers.mean_depth,
                    "loss": scored.mean_loss,
                    "byte_depth": float(np.mean([d for row in scored.depths for d in row])),
                    "cache_mib": scored.cache_bytes / 2**20,
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="the study's run folder (its OUT)")
    parser.add_argument("--out", type=Path, default=EXITS_CSV)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    frames = [
        read_exits(arm, seed, Path(args.runs) / f"{arm}-{seed}")
        for arm in P.ARMS
        for seed in P.SEEDS
        if (Path(args.runs) / f"{arm}-{seed}").is_dir()
    ]
    if not frames:
        parser.error(f"--runs {args.runs} holds no run of {', '.join(P.ARMS)} (folders <arm>-<seed>)")
    pd.concat(frames).sort_values(["arm", "seed", "exit", "cache"]).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
