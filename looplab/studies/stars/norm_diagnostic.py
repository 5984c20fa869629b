"""The STARS norm-placement diagnostic on 4-digit decimal addition, end to end.

Trains every preset in ``configs/stars-addition/`` (12 norm × placement
structures at a fixed 4 loops, the STARS recipe, and its no-JSRR ablation),
evaluates each from loops 1 to 128 in one unroll, and prints one table:
ID accuracy at the training depth, accuracy as test loops grow, and the
growth of the state norm. Finished runs are reused, so it can be re-run.

    python -m looplab.studies.stars.norm_diagnostic --out runs/stars-addition
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import pandas as pd

from looplab.config import PRESETS, load_config
from looplab.eval.run import evaluate_run
from looplab.plotting import save_figure
from looplab.train.trainer import train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STRUCTURES = PRESETS / "stars-addition"
LOOPS = (4, 8, 16, 32, 64, 128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/stars-addition")
    parser.add_argument("--only", nargs="*", help="preset names to run (default: all)")
    args = parser.parse_args()
    rows, curves = [], {}
    for preset in sorted(STRUCTURES.glob("*.toml")):
        if args.only and preset.stem not in args.only:
            continue
        run_dir = Path(args.out) / preset.stem
        train(load_config(preset), run_dir, progress=False)
        summary = evaluate_run(run_dir, scaling=True)
        curve = pd.read_csv(run_dir / "eval" / "scaling.csv")
        curves[preset.stem] = curve
        row = {"preset": preset.stem, "peak": summary["scaling_peak"], "peak_at": summary["scaling_peak_loops"]}
        row.update({f"acc@{k}": curve["accuracy"].iloc[k - 1] for k in LOOPS})
        row["norm@4"] = curve["state_norm"].iloc[3]
        row["norm@128"] = curve["state_norm"].iloc[-1]
        row["nonfinite@128"] = curve["nonfinite_fraction"].iloc[-1]
        rows.append(row)
        print(f"{preset.stem}: acc@4 {100 * row['acc@4']:.1f}%  acc@128 {100 * row['acc@128']:.1f}%", flush=True)
    table = pd.DataFrame(rows)
    percent = [c for c in table.columns if c.startswith("acc@") or c in ("peak", "nonfinite@128")]
    table[percent] = (100 * table[percent]).round(1)
    table[["norm@4", "norm@128"]] = table[["norm@4", "norm@128"]].round(2)
    print(table.to_string(index=False))
    table.to_csv(Path(args.out) / "diagnostic.csv", index=False)

    fig, (acc, norm) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, curve in curves.items():
        style = "-" if "stars" in name or "lognormal" in name else ":"
        acc.plot(curve["loops"], 100 * curve["accuracy"], style, label=name)
        norm.plot(curve["loops"], curve["state_norm"], style, label=name)
    acc.set(xlabel="test loops", ylabel="accuracy (%)", xscale="log", title="accuracy vs test loops")
    norm.set(xlabel="test loops", ylabel="‖h_t‖ per token", xscale="log", yscale="log", title="state norm")
    acc.legend(fontsize=7, ncol=2)
    save_figure(fig, Path(args.out) / "diagnostic.png")
    print(f"wrote {args.out}/diagnostic.csv and diagnostic.png")


if __name__ == "__main__":
    main()
