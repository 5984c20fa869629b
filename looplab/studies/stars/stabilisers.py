"""Stabilisers head to head on addition (docs/results/stars-stabilisers/PROTOCOL.md): per-seed rows and the page.

Decision rules, stated in the protocol before any run (accuracy at 256 loops, past the training
support [1, 100], is the primary metric; a diverged run counts as 0):

    JSRR with random loops   stars − lognormal           "adds" above 0, "hurts" below, else "not resolved"
    JSRR alone               fixed4-jsrr − fixed4        the same words
    stabilisers              frobenius, state_l2, prelude_coda, contractive − stars
                                                         "better" / "worse" / "not resolved"

each a Welch 95 % t-interval of the difference in means.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import seed_cell
from looplab.report.effect import comparison_line
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.report.runs import read_results, run_status, seconds_per_step

STUDY = "stars-stabilisers"
PRIMARY, METRIC = "acc_256", "accuracy at 256 loops"
READ_LOOPS = (4, 8, 16, 32, 64, 128, 256)
RHO_LOOPS = (8, 128)
ARM_ORDER = ("fixed4", "fixed4-jsrr", "lognormal", "stars", "frobenius", "state_l2", "prelude_coda", "contractive")
#: (question, arm, against it, word above 0, word below 0)
COMPARISONS = (
    ("JSRR with random loops", "stars", "lognormal", "adds", "hurts"),
    ("JSRR alone", "fixed4-jsrr", "fixed4", "adds", "hurts"),
    *(
        ("stabiliser", arm, "stars", "better", "worse")
        for arm in ("frobenius", "state_l2", "prelude_coda", "contractive")
    ),
)
RUNS_FILE, SCALING_FILE = "runs.csv", "scaling.csv"
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """``out/runs.csv`` (one row per run: accuracy at the read depths, the minimum over loops 4–256, the
    state norm at 256 loops, seconds per training step, ρ at loops 8 and 128 where measured) and
    ``out/scaling.csv`` (accuracy and state norm at every loop of every run)."""
    rows, curves = [], []
    for sweep_dir in sweep_dirs:
        results = read_results(Path(sweep_dir))
        for _, run in results.iterrows():
            run_dir = Path(sweep_dir) / "runs" / run["run_id"]
            row = {"arm": str(run["variant"]), "seed": int(run["run.seed"]), "run_id": run["run_id"]}
            row.update(_run_row(run_dir))
            rows.append(row)
            curve = run_dir / "eval" / SCALING_FILE
            if curve.is_file():
                frame = pd.read_csv(curve)[["loops", "accuracy", "state_norm"]]
                curves.append(frame.assign(arm=row["arm"], seed=row["seed"]))
    runs = pd.DataFrame(rows)
    runs = runs.sort_values(["arm", "seed"], key=lambda c: c.map(_rank) if c.name == "arm" else c).reset_index(
        drop=True
    )
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / RUNS_FILE, index=False)
    if curves:
        scaling = pd.concat(curves, ignore_index=True)[["arm", "seed", "loops", "accuracy", "state_norm"]]
        scaling.round(6).to_csv(out / SCALING_FILE, index=False)
    return runs


def _run_row(run_dir: Path) -> dict:
    """One run's columns of runs.csv; a diverged run (no scaling curve) reads 0 at every depth."""
    status = run_status(run_dir)
    row: dict = {"status": status}
    curve_path = run_dir / "eval" / SCALING_FILE
    if curve_path.is_file():
        curve = pd.read_csv(curve_path).set_index("loops")
        row.update({f"acc_{k}": float(curve.accuracy.get(k, np.nan)) for k in READ_LOOPS})
        row["acc_min_4_256"] = float(curve.accuracy.loc[4:256].min())
        row["state_norm_256"] = float(curve.state_norm.get(256, np.nan))
        row["nonfinite_256"] = float(curve.nonfinite_fraction.get(256, np.nan))
    elif status == "diverged":
        row.update({f"acc_{k}": 0.0 for k in READ_LOOPS} | {"acc_min_4_256": 0.0})
    row["step_s"] = seconds_per_step(run_dir)
    spectral = run_dir / "analysis" / "spectral.csv"
    if spectral.is_file():
        rho = pd.read_csv(spectral).groupby("loop")["rho_power"].mean()
        row.update({f"rho_{k}": float(rho.get(k, np.nan)) for k in RHO_LOOPS})
    return row


def _rank(arm: str) -> tuple[int, str]:
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


def _arms(runs: pd.DataFrame) -> list[str]:
    return sorted(set(runs.arm), key=_rank)


def decision_lines(runs: pd.DataFrame) -> list[str]:
    """The protocol's decisions on accuracy at 256 loops, each with its Welch interval and seed counts."""
    return [
        comparison_line(question, arm, other, _primary(runs, arm), _primary(runs, other), METRIC, above, below)
        for question, arm, other, above, below in COMPARISONS
    ]


def _primary(runs: pd.DataFrame, arm: str) -> np.ndarray:
    return runs.loc[runs.arm == arm, PRIMARY].dropna().to_numpy(dtype=float)


@register_block(f"{STUDY}/decisions")
def decisions_block(results_dir: Path) -> str:
    """The protocol's decisions, one line each."""
    return "\n".join(f"- {line}" for line in decision_lines(pd.read_csv(results_dir / STUDY / RUNS_FILE)))


@register_block(f"{STUDY}/accuracy")
def accuracy_block(results_dir: Path) -> str:
    """Per arm: accuracy at each read depth and its minimum over loops 4–256 (mean ± std [t-interval], %)."""
    runs = pd.read_csv(results_dir / STUDY / RUNS_FILE)
    columns = [(f"{k} loops", f"acc_{k}") for k in READ_LOOPS] + [("min, 4–256", "acc_min_4_256")]
    body = []
    for arm in sorted(_arms(runs), key=lambda a: -runs.loc[runs.arm == a, PRIMARY].mean()):
        part = runs[runs.arm == arm]
        diverged = int((part.status == "diverged").sum())
        body.append([arm, f"{len(part)}" + (f" ({diverged} diverged)" if diverged else "")])
        body[-1] += [seed_cell(part[column]) for _, column in columns]
    return markdown_table(["arm (by accuracy at 256 loops)", "seeds", *(title for title, _ in columns)], body)


#: the unregularised arm every arm's seconds per step are read against
COST_REFERENCE = "lognormal"


@register_block(f"{STUDY}/cost")
def cost_block(results_dir: Path) -> str:
    """Per arm: seconds per training step against lognormal's, state norm at 256 loops, ρ at 8 and 128 loops
    and the seeds with ρ < 1 there (n/a with its count where ρ was not measured)."""
    runs = pd.read_csv(results_dir / STUDY / RUNS_FILE)
    base = runs.loc[runs.arm == COST_REFERENCE, "step_s"].mean()
    body = []
    for arm in _arms(runs):
        part = runs[runs.arm == arm]
        cells = [
            arm,
            f"{part.step_s.mean():.3f}",
            f"{part.step_s.mean() / base:.2f}x" if np.isfinite(base) else "n/a",
            seed_cell(part.get("state_norm_256", pd.Series(dtype=float)), 1, 2, (0.0, np.inf)),
        ]
        for k in RHO_LOOPS:
            rho = part.get(f"rho_{k}", pd.Series(dtype=float)).dropna()
            cells.append(seed_cell(rho, 1, 3, (0.0, np.inf)))
            cells.append(f"{int((rho < 1).sum())} of {len(rho)}" if len(rho) else "n/a (0 seeds)")
        body.append(cells)
    header = ["arm", "s / step", "vs lognormal", "state norm, 256 loops"]
    for k in RHO_LOOPS:
        header += [f"ρ at {k} loops", f"ρ < 1 at {k}"]
    return markdown_table(header, body)
