"""How robust is the random-init norm × injection table (docs/results/mechanistic-grid/PROTOCOL.md): rows and blocks.

Per-seed rows, under ``docs/results/mechanistic-grid/``:

    runs.csv    placement, injection, init_std, embed_std, inject_gain, seed: the two fixed-point cosines
                the paper's table prints (the first layer's median per-sample cosine to its own late
                state, its minimum cosine to the other layers' states) and the last state norm
    bound.csv   placement, injection, seed at the shipped setting: the attention bound's tightness,
                observed ‖ΔA‖ / bound, its maximum and median over (layer, loop pair, window, head)

A seed *holds* a row's pattern when both cosines meet the paper's printed values by
:func:`looplab.studies.mechanistic.paper.meets` ("partly": one does); a grid point holds when at least 2 of
its 3 seeds do. Descriptive: the protocol states no decision rule.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from looplab.io import read_json_object
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen

STUDY = "mechanistic-grid"
AXES = ("init_std", "embed_std", "inject_gain")
SHIPPED = {"init_std": 0.4, "embed_std": 1.0, "inject_gain": 0.25}
ROW_ORDER = (
    ("pre", "concat"),
    ("pre", "none"),
    ("pre_sandwich", "concat"),
    ("pre_sandwich", "none"),
    ("post_sandwich", "concat"),
    ("post_sandwich", "none"),
)
SEEDS_TO_HOLD = 2
SELF, CROSS = "self_cos_median", "cross_cos_min"
RUNS_FILE, BOUND_FILE = "runs.csv", "bound.csv"
PAPER_TABLE = "mechanistic_norm_ablation.csv"
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """runs.csv from every analysed run of ``sweep_dirs``; bound.csv from re-tracing the shipped setting's runs."""
    from looplab.report.runs import read_results

    frames = []
    for sweep_dir in sweep_dirs:
        results = read_results(Path(sweep_dir))
        frames.append(
            pd.DataFrame(
                {
                    "placement": results["model.placement"],
                    "injection": results["model.injection"],
                    **{axis: results[f"model.{axis}"].astype(float) for axis in AXES},
                    "seed": results["run.seed"].astype(int),
                    SELF: results["analysis.fixed_point_self_cos_median"].astype(float),
                    CROSS: results["analysis.fixed_point_cross_cos_min"].astype(float),
                    "state_norm_last": results["analysis.state_norm_last"].astype(float),
                    "run_dir": [str(Path(sweep_dir) / d) for d in results["run_dir"]],
                }
            )
        )
    runs = pd.concat(frames, ignore_index=True)
    runs = runs.sort_values(["placement", "injection", *AXES, "seed"], key=_row_key).reset_index(drop=True)
    shipped = runs[np.logical_and.reduce([np.isclose(runs[axis], value) for axis, value in SHIPPED.items()])]
    bound = pd.DataFrame([{**_key(row), **attention_bound(Path(row.run_dir))} for row in shipped.itertuples()])
    out.mkdir(parents=True, exist_ok=True)
    runs.drop(columns="run_dir").round(6).to_csv(out / RUNS_FILE, index=False)
    bound.round(8).to_csv(out / BOUND_FILE, index=False)
    return runs


def _key(row) -> dict:
    return {"placement": row.placement, "injection": row.injection, "seed": row.seed}


def _row_key(column: pd.Series) -> pd.Series:
    if column.name == "placement":
        return column.map(lambda p: [r[0] for r in ROW_ORDER].index(p) if p in dict(ROW_ORDER) else 99)
    return column


@torch.no_grad()
def attention_bound(run_dir: Path) -> dict:
    """Observed ‖ΔA‖ over the bound for the run's model on the analysis's own windows: max and median."""
    from looplab.analysis.attention import lipschitz_check
    from looplab.analysis.mechanistic import analysis_trace
    from looplab.experiment import Experiment

    exp = Experiment.from_run(run_dir)
    summary = read_json_object(
        run_dir / "analysis" / "mechanistic" / "summary.json", "analysis summary", ("loops", "samples")
    )
    # the batch and initial-state noise the sweep's own analysis drew
    recorded = analysis_trace(exp, int(summary["loops"]), int(summary["samples"]), attention=True)
    ratio = lipschitz_check(exp.model, recorded).ratio
    finite = ratio[torch.isfinite(ratio)]
    return {
        "ratio_max": float(finite.max()) if finite.numel() else math.nan,
        "ratio_median": float(finite.median()) if finite.numel() else math.nan,
        "holds_share": float((ratio <= 1).double().mean()),
    }


# ---------------------------------------------------------------------------------------------- verdicts


def paper_rows() -> dict[tuple[str, str], dict]:
    """(placement, injection) → the paper's printed row (strings as printed)."""
    from looplab.report.comparison import PAPER_TABLES_DIR, read_paper_table
    from looplab.studies.mechanistic.paper import MECHANISTIC_NORMS

    table, _ = read_paper_table(PAPER_TABLE, PAPER_TABLES_DIR)
    rows = {}
    for placement, injection in ROW_ORDER:
        norm = MECHANISTIC_NORMS[placement]
        wanted = "no" if injection == "none" else "yes"
        match = table[table.norm.str.startswith(norm) & (table.input_injection == wanted)]
        rows[(placement, injection)] = match.iloc[0].to_dict()
    return rows


def seed_verdicts(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``met`` (0, 1 or 2 of the paper's cosines met) per seed."""
    from looplab.studies.mechanistic.paper import meets

    paper = paper_rows()

    def met(row) -> int:
        printed = paper[(row.placement, row.injection)]
        return int(meets(row[SELF], printed["cos_first_layer_to_own_fixed_point"])) + int(
            meets(row[CROSS], printed["min_cos_first_layer_to_other_layers_fixed_point"])
        )

    return runs.assign(met=runs.apply(met, axis=1))


def point_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (row, distinct grid point): seeds, seeds holding, seeds at least partly, and whether the point holds.

    A row without injection has no W_I, so its points differing only in ``inject_gain`` are one model:
    they are merged (their seeds counted once) before the shares are taken.
    """
    judged = seed_verdicts(runs)
    judged.loc[judged.injection == "none", "inject_gain"] = math.nan
    judged = judged.drop_duplicates(["placement", "injection", *AXES, "seed"])
    points = judged.groupby(["placement", "injection", *AXES], dropna=False, sort=False).agg(
        seeds=("met", "size"),
        holding=("met", lambda m: int((m == 2).sum())),
        partly=("met", lambda m: int((m >= 1).sum())),
    )
    points["holds"] = points.holding >= SEEDS_TO_HOLD
    points["partly_holds"] = points.partly >= SEEDS_TO_HOLD
    return points.reset_index()


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson 95 % interval of a proportion (NaN without trials)."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _share(successes: int, n: int) -> str:
    if n == 0:
        return "n/a (0)"
    low, high = wilson(successes, n)
    return f"{successes} of {n} ({100 * successes / n:.0f} %) [{100 * low:.0f}, {100 * high:.0f}]"


def _label(placement: str, injection: str) -> str:
    return f"{placement} / {'injection' if injection != 'none' else 'no injection'}"


@register_block(f"{STUDY}/shares")
def shares_block(results_dir: Path) -> str:
    """Per row: the paper's pattern, the grid points and (point, seed) pairs where it holds, Wilson 95 %."""
    runs = pd.read_csv(results_dir / STUDY / RUNS_FILE)
    points, judged, paper = point_table(runs), seed_verdicts(runs), paper_rows()
    body = []
    for placement, injection in ROW_ORDER:
        part = points[(points.placement == placement) & (points.injection == injection)]
        pairs = judged[(judged.placement == placement) & (judged.injection == injection)]
        printed = paper[(placement, injection)]
        body.append(
            [
                _label(placement, injection),
                f"{printed['cos_first_layer_to_own_fixed_point']} / "
                f"{printed['min_cos_first_layer_to_other_layers_fixed_point']} ({printed['verdict']})",
                _share(int(part.holds.sum()), len(part)),
                _share(int(part.partly_holds.sum()), len(part)),
                _share(int((pairs.met == 2).sum()), len(pairs)),
            ]
        )
    header = [
        "row",
        "paper: self cos / min cross cos",
        "grid points where it holds",
        "… at least partly",
        "(point, seed) pairs holding",
    ]
    return markdown_table(header, body)


@register_block(f"{STUDY}/axes")
def axes_block(results_dir: Path) -> str:
    """Per row and value of each initialisation axis: the share of grid points where the pattern holds."""
    points = point_table(pd.read_csv(results_dir / STUDY / RUNS_FILE))
    columns = [(axis, value) for axis in AXES for value in sorted(points[axis].dropna().unique())]
    body = []
    for placement, injection in ROW_ORDER:
        part = points[(points.placement == placement) & (points.injection == injection)]
        cells = [_label(placement, injection)]
        for axis, value in columns:
            at = part[np.isclose(part[axis], value)]
            cells.append(f"{int(at.holds.sum())}/{len(at)}" if len(at) else "–")
        body.append(cells)
    return markdown_table(["row", *(f"{axis} {value:g}" for axis, value in columns)], body)


@register_block(f"{STUDY}/shipped")
def shipped_block(results_dir: Path) -> str:
    """At the shipped setting: every seed's two cosines and verdict, and the attention bound's tightness."""
    runs = seed_verdicts(pd.read_csv(results_dir / STUDY / RUNS_FILE))
    bound = pd.read_csv(results_dir / STUDY / BOUND_FILE).set_index(["placement", "injection", "seed"])
    at = runs[np.logical_and.reduce([np.isclose(runs[axis], value) for axis, value in SHIPPED.items()])]
    words = {2: "holds", 1: "partly", 0: "no"}
    body = []
    for placement, injection in ROW_ORDER:
        for row in at[(at.placement == placement) & (at.injection == injection)].itertuples():
            key = (placement, injection, row.seed)
            tight = bound.loc[key] if key in bound.index else None
            body.append(
                [
                    _label(placement, injection),
                    str(row.seed),
                    f"{getattr(row, SELF):.4f}",
                    f"{getattr(row, CROSS):.4f}",
                    words[row.met],
                    "n/a" if tight is None else f"{tight.ratio_max:.2e}",
                    "n/a" if tight is None else f"{tight.ratio_median:.2e}",
                ]
            )
    header = [
        "row",
        "seed",
        "median self cos",
        "min cross cos",
        "paper pattern",
        "‖ΔA‖ / bound, max",
        "‖ΔA‖ / bound, median",
    ]
    return markdown_table(header, body)
