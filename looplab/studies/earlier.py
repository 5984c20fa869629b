"""Blocks of the earlier results pages, computed from the seed aggregates committed beside them.

Those studies kept one row per variant (``<metric>.n``, ``.mean``, ``.std``, as ``looplab
report`` writes ``table.csv``), not one per seed. From n, mean and std alone the Student-t
interval of a mean, the χ² interval of a std, the Welch interval of a difference of means and
the F-interval of a ratio of stds can all be recomputed exactly; a bootstrap or a
Brown–Forsythe test cannot, so these blocks show none. Where a page has per-seed rows (the
pilot's cell C read at 15 loops) its effect test is the full one of :mod:`looplab.report.effect`.
Their "Ours vs paper" blocks are in :mod:`looplab.studies.earlier_paper`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from scipy import stats as scipy_stats

from looplab.report.aggregate import FEW_SEEDS, LEVEL, chi2_std_interval
from looplab.report.effect import describe, effect, f_from_stats, welch_from_stats
from looplab.report.pages import markdown_table, register_block
from looplab.schedules.base import SCHEDULES, DepthRule

Q = (1 + LEVEL) / 2


def _t_cell(n: float, mean: float, std: float, digits: int, bounds=(-math.inf, math.inf)) -> str:
    """ "mean ± std [t-interval, clipped to ``bounds``]" from a seed aggregate; "n/a (0 seeds)" when n = 0."""
    if not n or not math.isfinite(mean):
        return "n/a (0 seeds)"
    if n < 2 or not math.isfinite(std):
        return f"{mean:.{digits}f}"
    half = scipy_stats.t.ppf(Q, n - 1) * std / math.sqrt(n)
    low, high = max(mean - half, bounds[0]), min(mean + half, bounds[1])
    return f"{mean:.{digits}f} ± {std:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def value_range(stem: str) -> tuple[float, float]:
    """The range a metric's values lie in, from its name: a relative drop is at most 100 % (and a drop
    from the peak at least 0), another percentage (``(%)``, ``_pct``) lies in 0–100, the Gap in ±100 pp
    (:func:`gap_range` narrows it per schedule), a loop count is at least 1, a cosine in
    −1..1, a fraction in 0–1, a norm, ratio, difference or ColSum at least 0; anything else is unbounded."""
    if "drop" in stem:  # a drop from the peak is never negative; one between two depths may be
        return (0.0 if "peak" in stem else -math.inf), 100.0
    if "(%)" in stem or stem.endswith("_pct"):
        return 0.0, 100.0
    if stem.lower().startswith("gap"):  # a difference of two percentages; per schedule: gap_range
        return -100.0, 100.0
    if "loops" in stem.lower() and "(" not in stem:
        return 1.0, math.inf
    if "cos" in stem:
        return -1.0, 1.0
    if "fraction" in stem or stem.startswith("token_dynamics."):
        return 0.0, 1.0
    if any(word in stem for word in ("norm", "ratio", "diff", "colsum")):
        return 0.0, math.inf
    return -math.inf, math.inf


def gap_range(schedule: str) -> tuple[float, float]:
    """The values a schedule's Gap (pp) can take. Gap(n) = Oracle(n) − Policy(n), where Oracle(n) is the
    accuracy at the best single K: a schedule whose test depth is a function of the length alone (a
    :class:`~looplab.schedules.base.DepthRule`) reads every sample of a length at one K, so its Policy(n) is
    one of the accuracies Oracle(n) maximises over and its Gap is at least 0; a learned halting policy reads
    each sample at its own depth and can beat every single K, so its Gap may be negative (to −100)."""
    rule = SCHEDULES.get(schedule)
    return (0.0 if rule is not None and issubclass(rule, DepthRule) else -100.0), 100.0


def _bounds(stem: str, row: pd.Series) -> tuple[float, float]:
    """:func:`value_range`, with a Gap's narrowed to what the row's schedule (its ``variant``) allows."""
    if stem.lower().startswith("gap") and "variant" in row:
        return gap_range(str(row["variant"]))
    return value_range(stem)


def chi2_cell(n: float, std: float, digits: int = 1) -> str:
    """The std with its χ² 95 % interval (:func:`looplab.report.aggregate.chi2_std_interval`); "n/a" below 2 seeds."""
    lo, hi = chi2_std_interval(std, int(n))
    return "n/a" if not math.isfinite(lo) else f"{std:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _seeds(n: float) -> str:
    return f"{int(n)} (few)" if n < FEW_SEEDS else str(int(n))


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
        cells += [_t_cell(row[f"{s}.n"], row[f"{s}.mean"], row[f"{s}.std"], d, _bounds(s, row)) for s, _, d in metrics]
        if spread:
            cells.insert(at, chi2_cell(row[f"{spread}.n"], row[f"{spread}.std"]))
        body.append(cells)
    return markdown_table(header, body)


@dataclass(frozen=True)
class AggregateEffect:
    """The effect test from two seed aggregates: Welch for the Gap difference, F for the std ratio."""

    seeds: tuple[int, int]
    gap_difference: float
    gap_welch: tuple[float, float]
    ratio: float
    ratio_f: tuple[float, float]

    @property
    def gap_holds(self) -> bool:
        return self.gap_welch[0] > 0

    @property
    def std_holds(self) -> bool:
        return self.ratio_f[0] > 1

    @property
    def verdict(self) -> str:
        words = {(True, True): "both halves hold", (True, False): "Gap half only", (False, True): "Std half only"}
        return words.get((self.gap_holds, self.std_holds), "neither half holds")


def aggregate_effect(a: pd.Series, b: pd.Series) -> AggregateEffect:
    """:class:`AggregateEffect` of ``a`` (the reference) against ``b``, rows with ``gap_pp.*`` and ``oracle_ood_pct.*``;
    the ratio and its interval NaN when ``b``'s seeds do not spread (its Std half cannot hold)."""
    na, nb = a["gap_pp.n"], b["gap_pp.n"]
    return AggregateEffect(
        seeds=(int(na), int(nb)),
        gap_difference=float(a["gap_pp.mean"] - b["gap_pp.mean"]),
        gap_welch=welch_from_stats(a["gap_pp.mean"], a["gap_pp.std"], na, b["gap_pp.mean"], b["gap_pp.std"], nb),
        ratio=float(a["oracle_ood_pct.std"] / b["oracle_ood_pct.std"]) if b["oracle_ood_pct.std"] > 0 else math.nan,
        ratio_f=f_from_stats(
            a["oracle_ood_pct.std"], a["oracle_ood_pct.n"], b["oracle_ood_pct.std"], b["oracle_ood_pct.n"]
        ),
    )


def aggregate_effects(frame: pd.DataFrame, task: str, reference: str, others: list[str]) -> list[list[str]]:
    """Welch interval of the Gap difference and F-interval of the std ratio of Oracle OOD, from aggregates."""
    rows = frame[frame["task.name"] == task].set_index("variant")
    body = []
    for other in others:
        result = aggregate_effect(rows.loc[reference], rows.loc[other])
        (gap_lo, gap_hi), (f_lo, f_hi) = result.gap_welch, result.ratio_f
        body.append(
            [
                f"{task}: {reference} vs {other}",
                f"{result.seeds[0]} / {result.seeds[1]}",
                f"{result.gap_difference:.1f} [{gap_lo:.1f}, {gap_hi:.1f}]",
                f"{result.ratio:.2f} [{f_lo:.2f}, {f_hi:.2f}]"
                if math.isfinite(result.ratio)
                else f"n/a ({other}: no spread)",
                result.verdict,
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
#: the stopping pilots' control arm, against which every other schedule's effect is read
PILOT_REFERENCE = "fixed"
#: the schedules the stopping-small protocol compares with it
PROTOCOL_OTHERS = ["matched", "window", "rl_halting"]


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
        body += aggregate_effects(frame, task, PILOT_REFERENCE, PROTOCOL_OTHERS)
    return markdown_table(EFFECT_HEADER, body)


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
            + [
                _t_cell(n, 100 * part[c].mean(), 100 * part[c].std(ddof=1), 1, (0.0, 100.0))
                for c in ("oracle_ood", "policy_ood")
            ]
            + [chi2_cell(n, 100 * part["oracle_ood"].std(ddof=1))]
            + [_t_cell(n, 100 * part["gap"].mean(), 100 * part["gap"].std(ddof=1), 1, gap_range(schedule))]
            + [f"{part['depth'].mean():.1f}"]
        )
    table = markdown_table(
        ["schedule", "seeds", "Oracle OOD (%)", "Policy OOD (%)", "Std (pp) [χ²]", "Gap (pp)", "policy depth (OOD)"],
        body,
    )
    fixed = seeds[seeds["schedule"] == PILOT_REFERENCE]
    lines = []
    for other in [s for s in seeds["schedule"].unique() if s != PILOT_REFERENCE]:
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


#: earlier report pages' tables, each from its extracted cells, keyed by variant
for _block, _cells in {
    "mechanistic-small/analysis": "mechanistic-small/cells.csv",
    "stopping-small-binary_addition/results": "stopping-small-binary_addition/cells.csv",
    "stars-small/results": "stars-small/results.csv",
    "stars-small/scaling": "stars-small/scaling.csv",
}.items():

    @register_block(_block)
    def _earlier_page(results_dir: Path, cells: str = _cells) -> str:
        return _cells_table(results_dir, cells, [("variant", "variant")])


@register_block("stars-lm/drop-table")
def _stars_lm(results_dir: Path) -> str:
    frame = _read(results_dir, "stars-lm/paper_stars_lm.csv")
    stems = [c.removesuffix(".mean") for c in frame.columns if c.endswith(".mean")]
    table = frame.rename(columns={"part": "model"})
    return aggregate_table(table, [("model", "model"), ("recipe", "recipe")], [(s, s, 1) for s in stems])


#: the earlier pages whose run count their first line states, and the cells file it is the sum of the seeds of
RUN_COUNTS = {
    "mechanistic-small/runs": ("mechanistic-small/cells.csv", "fixed_point_self_cos.n"),
    "stopping-small-binary_addition/runs": ("stopping-small-binary_addition/cells.csv", "Oracle OOD (%).n"),
    "stars-small/runs": ("stars-small/results.csv", "Oracle ID (%).n"),
}
for _block, (_cells, _column) in RUN_COUNTS.items():

    @register_block(_block)
    def _run_count(results_dir: Path, cells: str = _cells, column: str = _column) -> str:
        frame = _read(results_dir, cells)
        return f"{int(frame[column].sum())} finished runs ({len(frame)} variants × their seeds, from `{cells}`)."


#: the task mechanistic-small traced (its presets configs/mechanistic/ablation-*.toml)
MECHANISTIC_SMALL_TASK = "kjv"


@register_block("mechanistic-small/seeds")
def _mechanistic_small_seeds(results_dir: Path) -> str:
    """Per variant: its seeds and the runs whose training diverged (``diverged``, as the report counted them
    from the runs' status). A diverged run has no metrics, so the seeds are the metrics' n plus the diverged."""
    frame = _read(results_dir, "mechanistic-small/cells.csv")
    body = [
        [MECHANISTIC_SMALL_TASK, str(row["variant"]), _seeds(row["fixed_point_self_cos.n"] + row["diverged"])]
        + [str(int(row["diverged"]))]
        for _, row in frame.iterrows()
    ]
    return markdown_table(["Task", "Variant", "Seeds", "Diverged"], body)
