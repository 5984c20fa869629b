"""Exploratory, chosen after the confirmation study's decision (no rule decides it): the decided recipe — the
contractive injection with ``train.shared_view_weight = 0.5`` — on the d 256 demo LM (preset
``generation/kjv_trace_d256``, its 1,500 steps; one seed, 7401, not one of the study's), read as the study
reads a run: ``per_loop`` against ``shared`` at 4, 8 and 16 loops on the study's 1,000 chain-trace problems
and 64 KJV passages.

    python -m looplab.studies.flat_cache_confirm.d256 --out runs/flat-cache-d256 [--threads 1]

trains into OUT/run (skipped when its last checkpoint is there) and writes its reads to
docs/results/flat-cache-confirm/exploratory-d256.csv, which the study's page shows in a section of its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from looplab.studies.flat_cache_confirm import protocol as P

ARM = "contractive_view_d256"
SEED = 7401
#: what :func:`looplab.studies.flat_cache.run.train_run` reads of a protocol: the d 256 preset's own 1,500 steps
RECIPE = SimpleNamespace(PRESET="generation/kjv_trace_d256", STEPS=1500, ARMS={ARM: P.ARMS["contractive_view"]})
CSV = Path("docs/results/flat-cache-confirm/exploratory-d256.csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the run is trained")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    from looplab.studies.flat_cache.run import train_run
    from looplab.studies.flat_cache_confirm.run import read_run

    run_dir = Path(args.out) / "run"
    train_run(ARM, SEED, run_dir, args.threads, RECIPE)
    reads = read_run(ARM, SEED, run_dir)["reads.csv"]
    reads.to_csv(args.csv, index=False)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
