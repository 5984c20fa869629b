"""Train and read the flat-memory cache study's runs (:mod:`looplab.studies.flat_cache.protocol`).

    python -m looplab.studies.flat_cache.run --out runs/flat-cache [--arms fixed4 stars] [--seeds 7101]

Each (arm, seed) trains into OUT/<arm>-<seed> (skipped when its last checkpoint is there; a killed run
resumes) and is read once into OUT/<arm>-<seed>/reads.csv; OUT/reads.csv gathers every run's rows
(arm, seed, loops, cache, exact_match, loss, mean_depth, cache_mib), the file the page reads, and
OUT/provenance.csv each run's start time, commit and whether its checkout was clean (``looplab results --check``
holds them against the protocol's commit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from looplab.studies.flat_cache import protocol as P

READS = "reads.csv"


def train_run(arm: str, seed: int, run_dir: Path, threads: int, protocol=P) -> None:
    """Train (or finish training) one run of ``protocol`` (a module with PRESET, STEPS and ARMS)."""
    from looplab.checkpoint import latest_checkpoint
    from looplab.config import load_config
    from looplab.train.trainer import train

    steps = protocol.STEPS
    overrides = [*protocol.ARMS[arm], f"run.seed={seed}", f"train.steps={steps}", f"run.threads={threads}"]
    checkpoint = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if checkpoint is not None and checkpoint.name == f"step_{steps:07d}":
        return
    train(load_config(protocol.PRESET, overrides), run_dir, progress=False)


def study_inputs(exp) -> tuple[list[tuple[str, str]], list[list[int]]]:
    """The protocol's chain-trace problems ((question, answer) texts) and KJV passages (byte ids) for the
    run ``exp`` (an Experiment): the same for every run."""
    from looplab.seeding import derive_generator
    from looplab.tasks.reasoning import ChainTrace

    generator = derive_generator(0, "flat-cache", "problems")
    problems = [p for n in range(1, 5) for p in ChainTrace().draw(n, P.PROBLEMS, generator)]
    passages, _ = exp.task.sample_split(
        P.PASSAGE_BYTES, P.PASSAGES, derive_generator(0, "flat-cache", "passages"), "val"
    )
    return problems, [row.tolist() for row in passages]


def read_run(arm: str, seed: int, run_dir: Path) -> pd.DataFrame:
    """The protocol's reads of one trained run: a row per (loops, cache)."""
    from looplab.experiment import Experiment
    from looplab.generation import DecodeOptions, GenerationExit, score
    from looplab.generation.reasoning import decode_answers

    exp = Experiment.from_run(run_dir)
    problems, passages = study_inputs(exp)
    rows = []
    for loops in P.READ_LOOPS:
        rule = GenerationExit("fixed", loops)
        for cache in P.CACHES:
            options = DecodeOptions(
                rule, cache, cache_params={"keep_loops": P.KEEP_LOOPS} if cache == "last_m" else None
            )
            answers = decode_answers(exp.model, problems, options)
            scored = score(exp.model, passages, options)
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "loops": loops,
                    "cache": cache,
                    "exact_match": 100 * answers.exact_match,
                    "loss": scored.mean_loss,
                    "mean_depth": answers.mean_depth,
                    "cache_mib": scored.cache_bytes / 2**20,
                }
            )
    return pd.DataFrame(rows)


def main(protocol=P, study: str = "flat-cache", description: str = __doc__.splitlines()[0]) -> None:
    """The command line of ``protocol``'s runner (this study's, or one that reads its runs the same way)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="the study's run folder")
    parser.add_argument("--arms", nargs="+", choices=list(protocol.ARMS), default=list(protocol.ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, choices=protocol.SEEDS, default=list(protocol.SEEDS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    for seed in args.seeds:  # seed-major: a partial study has every arm at its first seeds
        for arm in args.arms:
            run_dir = out / f"{arm}-{seed}"
            train_run(arm, seed, run_dir, args.threads, protocol)
            reads = run_dir / READS
            if not reads.is_file():
                read_run(arm, seed, run_dir).to_csv(reads, index=False)
            print(f"{study}: {arm} seed {seed} read", flush=True)
    frames = [pd.read_csv(path) for path in sorted(out.glob(f"*/{READS}"))]
    pd.concat(frames).sort_values(["arm", "seed", "loops", "cache"]).to_csv(out / READS, index=False)
    from looplab.report.preregistration import PROVENANCE_CSV, provenance_rows

    provenance_rows([out]).to_csv(out / PROVENANCE_CSV, index=False)  # each run's start, commit and checkout
    print(f"wrote {out / READS} and {out / PROVENANCE_CSV}")


if __name__ == "__main__":
    main()
