"""Train and read the flat-cache confirmation study's runs (:mod:`looplab.studies.flat_cache_confirm.protocol`).

    python -m looplab.studies.flat_cache_confirm.run --out runs/flat-cache-confirm [--arms contractive]
        [--seeds 7301 7302] [--threads 1] [--collect]

Each (arm, seed) trains into OUT/<arm>-<seed> (skipped when its last checkpoint is there; a killed run
resumes) and is read once into that folder's reads.csv (a row per loops × cache), problems.csv (per
loops and problem: right under per_loop, under shared) and passages.csv (per loops and passage: the loss
under each cache). Seeds run seed-major, so a partial study has every arm at its first seeds; two
processes with disjoint --seeds share the work. ``--collect`` (also done after the runs) gathers every
run's files into OUT/reads.csv, OUT/problems.csv, OUT/passages.csv and OUT/provenance.csv (each run's
start, commit and whether its checkout was clean, which ``looplab results --check`` holds against the
protocol's commit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.studies.flat_cache.run import train_run
from looplab.studies.flat_cache_confirm import protocol as P

FILES = ("reads.csv", "problems.csv", "passages.csv")


def study_inputs(exp) -> tuple[list[tuple[str, str]], list[int], list[list[int]]]:
    """The protocol's chain-trace problems ((question, answer) texts), each one's step count, and the KJV
    passages (byte ids) for the run ``exp`` (an Experiment): the same for every run."""
    from looplab.seeding import derive_generator
    from looplab.tasks.reasoning import ChainTrace

    generator = derive_generator(0, "flat-cache-confirm", "problems")
    problems, steps = [], []
    for n in range(1, 5):
        drawn = ChainTrace().draw(n, P.PROBLEMS, generator)
        problems += drawn
        steps += [n] * len(drawn)
    passages, _ = exp.task.sample_split(
        P.PASSAGE_BYTES, P.PASSAGES, derive_generator(0, "flat-cache-confirm", "passages"), "val"
    )
    return problems, steps, [row.tolist() for row in passages]


def read_run(arm: str, seed: int, run_dir: Path) -> dict[str, pd.DataFrame]:
    """The protocol's reads of one trained run: its reads, problems and passages tables."""
    from looplab.experiment import Experiment
    from looplab.generation import DecodeOptions, GenerationExit, score
    from looplab.generation.reasoning import decode_answers

    exp = Experiment.from_run(run_dir)
    problems, steps, passages = study_inputs(exp)
    reads, per_problem, per_passage = [], [], []
    for loops in P.READ_LOOPS:
        rule = GenerationExit("fixed", loops)
        right, losses = {}, {}
        for cache in P.CACHES:
            answers = decode_answers(exp.model, problems, DecodeOptions(rule, cache))
            scored = score(exp.model, passages, DecodeOptions(rule, cache))
            right[cache] = answers.correct.astype(int)
            losses[cache] = np.array([-np.mean(row) for row in scored.logprobs])
            reads.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "loops": loops,
                    "cache": cache,
                    "exact_match": 100 * answers.exact_match,
                    "loss": scored.mean_loss,
                    "cache_mib": scored.cache_bytes / 2**20,
                }
            )
        base = {"arm": arm, "seed": seed, "loops": loops}
        per_problem.append(pd.DataFrame({**base, "problem": range(len(problems)), "steps": steps, **right}))
        per_passage.append(pd.DataFrame({**base, "passage": range(len(passages)), **losses}))
    return {
        "reads.csv": pd.DataFrame(reads),
        "problems.csv": pd.concat(per_problem, ignore_index=True),
        "passages.csv": pd.concat(per_passage, ignore_index=True),
    }


def collect(out: Path) -> None:
    """Gather every finished run's tables into OUT, and the runs' provenance."""
    from looplab.report.preregistration import PROVENANCE_CSV, provenance_rows

    for name in FILES:
        frames = [pd.read_csv(path) for path in sorted(out.glob(f"*/{name}"))]
        if frames:
            pd.concat(frames, ignore_index=True).sort_values(["arm", "seed", "loops"], kind="stable").to_csv(
                out / name, index=False
            )
    provenance_rows([out]).to_csv(out / PROVENANCE_CSV, index=False)
    print(f"wrote {', '.join(str(out / name) for name in FILES)} and {out / PROVENANCE_CSV}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the study's run folder")
    parser.add_argument("--arms", nargs="+", choices=list(P.ARMS), default=list(P.ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, choices=P.SEEDS, default=list(P.SEEDS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--collect", action="store_true", help="only gather the finished runs' files")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.collect:
        import torch

        torch.set_num_threads(args.threads)
        for seed in args.seeds:  # seed-major: a partial study has every arm at its first seeds
            for arm in args.arms:
                run_dir = out / f"{arm}-{seed}"
                train_run(arm, seed, run_dir, args.threads, P)
                if not all((run_dir / name).is_file() for name in FILES):
                    for name, table in read_run(arm, seed, run_dir).items():
                        table.to_csv(run_dir / name, index=False)
                print(f"flat-cache-confirm: {arm} seed {seed} read", flush=True)
    collect(out)


if __name__ == "__main__":
    main()
