"""Blocks of the earlier results pages, computed from the seed aggregates committed beside them.

Those studies kept one row per variant (``<metric>.n``, ``.mean``, ``.std``, as ``looplab
report`` writes ``table.csv``), not one per seed. From n, mean and std alone the Student-t
interval of a mean, the χ² interval of a std, the Welch interval of a difference of means and
the F-interval of a ratio of stds can all be recomputed exactly; a bootstrap or a
Brown–Forsythe test cannot, so these blocks show none. Where a page has per-seed rows (the
pilot's cell C read at 15 loops) its effect test is the full one of :mod:`looplab.report.effect`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from scipy import stats as scipy_stats

from looplab.report.aggregate import FEW_SEEDS, LEVEL
from looplab.report.effect import describe, effect
from looplab.report.pages import register_block

Q = (1 + LEVEL) / 2


def _t_cell(n: float, mean: float, std: float, digits: int) -> str:
    """ "mean ± std [t-interval]" from a seed aggregate; "n/a (0 seeds)" when n = 0."""
    if not n or not math.isfinite(mean):
        return "n/a (0 seeds)"
    if n < 2 or not math.isfinite(std):
        return f"{mean:.{digits}f}"
    half = scipy_stats.t.ppf(Q, n - 1) * std / math.sqrt(n)
    return f"{mean:.{digits}f} ± {std:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"


def _chi2_cell(n: float, std: float, digits: int = 1) -> str:
    """The std with its χ² 95 % interval: σ ∈ [s √((n−1)/χ²_{0.975}), s √((n−1)/χ²_{0.025})]."""
    if n < 2 or not math.isfinite(std):
        return "n/a"
    lo, hi = (std * math.sqrt((n - 1) / scipy_stats.chi2.ppf(q, n - 1)) for q in (Q, 1 - Q))
    return f"{std:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _seeds(n: float) -> str:
    return f"{int(n)} (few)" if n < FEW_SEEDS else str(int(n))


def _markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def aggregate_table(
    frame: pd.DataFrame, keys: list[tuple[str, str]], metrics: list[tuple[str, str, int]], spread: str | None = None
) -> str:
    """One line per row of ``frame``: its key cells, the seed count, and per metric "mean ± std [t]".

    ``keys`` are (column, header); ``metrics`` (stem, header, digits) with columns ``stem.n``,
    ``stem.mean``, ``stem.std``; ``spread`` a stem whose std gets its own column with its χ² interval.
    """
    header = [h for _, h in keys] + ["seeds"] + [h for _, h, _ in metrics]
    # the Std column right after its metric's column
    at = len(keys) + 2 + [s for s, _, _ in metrics].index(spread) if spread else None
    if spread:
        header.insert(at, "Std (pp) [χ²]")
    body = []
    for _, row in frame.iterrows():
        n = row[f"{metrics[0][0]}.n"]
        cells = [str(row[c]) for c, _ in keys] + [_seeds(n)]
        cells += [_t_cell(row[f"{s}.n"], row[f"{s}.mean"], row[f"{s}.std"], d) for s, _, d in metrics]
        if spread:
            cells.insert(at, _chi2_cell(row[f"{spread}.n"], row[f"{spread}.std"]))
        body.append(cells)
    return _markdown(header, body)


def aggregate_effects(frame: pd.DataFrame, task: str, reference: str, others: list[str]) -> list[list[str]]:
    """Welch interval of the Gap difference and F-interval of the std ratio of Oracle OOD, from aggregates."""
    rows = frame[frame["task.name"] == task].set_index("variant")
    body = []
    for other in others:
        a, b = rows.loc[reference], rows.loc[other]
        na, nb = a["gap_pp.n"], b["gap_pp.n"]
        va, vb = a["gap_pp.std"] ** 2 / na, b["gap_pp.std"] ** 2 / nb
        dof = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
        diff = a["gap_pp.mean"] - b["gap_pp.mean"]
        half = scipy_stats.t.ppf(Q, dof) * math.sqrt(va + vb)
        ratio = a["oracle_ood_pct.std"] / b["oracle_ood_pct.std"]
        upper_q, lower_q = scipy_stats.f.ppf([Q, 1 - Q], a["oracle_ood_pct.n"] - 1, b["oracle_ood_pct.n"] - 1)
        f_lo, f_hi = ratio / math.sqrt(upper_q), ratio / math.sqrt(lower_q)
        gap_holds, std_holds = diff - half > 0, f_lo > 1
        verdict = {(True, True): "both halves hold", (True, False): "Gap half only", (False, True): "Std half only"}
        body.append(
            [
                f"{task}: {reference} vs {other}",
                f"{int(na)} / {int(nb)}",
                f"{diff:.1f} [{diff - half:.1f}, {diff + half:.1f}]",
                f"{ratio:.2f} [{f_lo:.2f}, {f_hi:.2f}]",
                verdict.get((gap_holds, std_holds), "neither half holds"),
            ]
        )
    return body


EFFECT_HEADER = ["comparison", "seeds", "Gap difference (pp) [Welch]", "std ratio [F]", "by Welch and F alone"]
PROTOCOL_METRICS = [
    ("oracle_id_pct", "Oracle ID (%)", 1),
    ("oracle_ood_pct", "Oracle OOD (%)", 1),
    ("policy_ood_pct", "Policy OOD (%)", 1),
    ("gap_pp", "Gap (pp)", 1),
    ("front90", "Front@90", 1),
]
KEYS = [("task.name", "task"), ("variant", "schedule")]


def _read(results_dir: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(Path(results_dir) / name)


@register_block("stopping-study/protocol")
def _protocol(results_dir: Path) -> str:
    return aggregate_table(_read(results_dir, "stopping-small/results.csv"), KEYS, PROTOCOL_METRICS, "oracle_ood_pct")


@register_block("stopping-study/protocol-effects")
def _protocol_effects(results_dir: Path) -> str:
    frame = _read(results_dir, "stopping-small/results.csv")
    body = []
    for task in ("dyck1", "binary_addition"):
        body += aggregate_effects(frame, task, "fixed", ["matched", "window", "rl_halting"])
    return _markdown(EFFECT_HEADER, body)


for _cell_name, _file in {
    "B": "B-binary_addition-nope.csv",
    "C": "C-dyck1-nope-window1.csv",
    "C-rl_halting": "C-dyck1-nope-window1-rl_halting.csv",
    "D": "D-binary_addition-nope-window1.csv",
    "F": "C-dyck1-steps1800.csv",
}.items():

    @register_block(f"stopping-study/pilot-{_cell_name}")
    def _pilot(results_dir: Path, file: str = _file) -> str:
        frame = _read(results_dir, f"stopping-pilot/{file}")
        return aggregate_table(frame, KEYS, PROTOCOL_METRICS[1:], "oracle_ood_pct")


@register_block("stopping-study/pilot-C-T15")
def _pilot_c_t15(results_dir: Path) -> str:
    """Cell C read at 15 loops, from its per-seed rows: the table and the full effect test against fixed."""
    seeds = _read(results_dir, "stopping-pilot/C-dyck1-nope-window1-T15.csv")
    body = []
    for schedule, part in seeds.groupby("schedule", sort=False):
        n = len(part)
        body.append(
            [schedule, _seeds(n)]
            + [_t_cell(n, 100 * part[c].mean(), 100 * part[c].std(ddof=1), 1) for c in ("oracle_ood", "policy_ood")]
            + [_chi2_cell(n, 100 * part["oracle_ood"].std(ddof=1))]
            + [_t_cell(n, 100 * part["gap"].mean(), 100 * part["gap"].std(ddof=1), 1)]
            + [f"{part['depth'].mean():.1f}"]
        )
    table = _markdown(
        ["schedule", "seeds", "Oracle OOD (%)", "Policy OOD (%)", "Std (pp) [χ²]", "Gap (pp)", "policy depth (OOD)"],
        body,
    )
    fixed = seeds[seeds["schedule"] == "fixed"]
    lines = []
    for other in [s for s in seeds["schedule"].unique() if s != "fixed"]:
        part = seeds[seeds["schedule"] == other]
        result = effect(fixed["oracle_ood"], part["oracle_ood"], 100 * fixed["gap"], 100 * part["gap"])
        lines.append(f"- fixed vs {other}: {describe(result)}.")
    return table + "\n\nEffect test against fixed (the rule of `looplab.report.effect`):\n\n" + "\n".join(lines)


def _cells_table(results_dir: Path, name: str, keys: list[tuple[str, str]]) -> str:
    """A table of an earlier report page from its extracted cells (``<stem>.n/.mean/.std`` columns)."""
    frame = _read(results_dir, name)
    stems = list(dict.fromkeys(c.rsplit(".", 1)[0] for c in frame.columns if c.endswith(".mean")))
    digits = [int(frame[f"{s}.digits"].iloc[0]) if f"{s}.digits" in frame else 3 for s in stems]
    return aggregate_table(frame, keys, [(s, s, d) for s, d in zip(stems, digits)])


@register_block("mechanistic-small/analysis")
def _mechanistic(results_dir: Path) -> str:
    return _cells_table(results_dir, "mechanistic-small/cells.csv", [("variant", "variant")])


@register_block("stopping-small-binary_addition/results")
def _binary_addition(results_dir: Path) -> str:
    return _cells_table(results_dir, "stopping-small-binary_addition/cells.csv", [("variant", "variant")])


@register_block("stars-small/results")
def _stars_small_results(results_dir: Path) -> str:
    return _cells_table(results_dir, "stars-small/results.csv", [("variant", "variant")])


@register_block("stars-small/scaling")
def _stars_small_scaling(results_dir: Path) -> str:
    return _cells_table(results_dir, "stars-small/scaling.csv", [("variant", "variant")])


@register_block("stars-lm/drop-table")
def _stars_lm(results_dir: Path) -> str:
    frame = _read(results_dir, "stars-lm/paper_stars_lm.csv")
    stems = [c.removesuffix(".mean") for c in frame.columns if c.endswith(".mean")]
    table = frame.rename(columns={"part": "model"})
    return aggregate_table(table, [("model", "model"), ("recipe", "recipe")], [(s, s, 1) for s in stems])
