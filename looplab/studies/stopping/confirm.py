"""The confirmatory stopping study (docs/results/stopping-confirm/PROTOCOL.md): per-run rows and its page.

:func:`collect` reads every run of the study's sweeps at both read horizons and recomputes each
run's metrics from its per-sample outcomes (``eval/samples.parquet``, ``eval/loops30/…``) with
the released metric code: the flip rate over K ∈ [FLIP_FROM, T − 1], the same range for every
arm. One row per (run, horizon) goes to ``runs.csv``; each run's flip curve to
``flip_curves.csv``. The page's blocks are computed from those two files alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.errors import LooplabError
from looplab.eval.metrics import summarize
from looplab.eval.run import EVAL_DIR
from looplab.eval.samples import SAMPLES_FILE, read_samples
from looplab.report.aggregate import metric_range, seed_stats
from looplab.report.effect import Effect, effect
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.rundir import load_run_config, read_log
from looplab.studies.earlier import chi2_cell, gap_range

STUDY = "stopping-confirm"
FLIP_FROM = 10  # the training depth T_train = T(10): the flip range starts there for every arm
HORIZONS = {15: "", 30: "loops30"}  # read horizon → its folder under RUN_DIR/eval
MAIN_STEPS, LONG_STEPS = 600, 2400
ARMS = ("fixed", "matched", "window", "fixed_window", "multi_depth", "rl_halting", "pondernet")
LABELS = {
    "fixed": "fixed K = 10",
    "matched": "matched T(n)",
    "window": "window T(n) ± 3",
    "fixed_window": "fixed window 10 ± 3",
    "multi_depth": "multi-depth T(n) ± 3",
    "rl_halting": "RL-Halting",
    "pondernet": "PonderNet",
}
#: the protocol's comparisons (reference, arm): every arm against fixed, and window against matched
COMPARISONS = [*(("fixed", arm) for arm in ARMS[1:]), ("matched", "window")]
CLAIM_ARMS = ("window", "rl_halting")
RUNS_FILE, CURVES_FILE = "runs.csv", "flip_curves.csv"


# ----------------------------------------------------------------------------- collecting
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


def run_rows(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The (run, horizon) rows and flip-curve rows of one run dir; an error for a run not evaluated at both."""
    config = load_run_config(run_dir)
    records = read_log(run_dir)
    block_evals = float(np.mean([r["block_evals"] for r in records])) if records else math.nan
    rows, curves = [], []
    for horizon, folder in HORIZONS.items():
        where = run_dir / EVAL_DIR / folder
        if not (where / SAMPLES_FILE).is_file():
            raise LooplabError(f"{where}: no {SAMPLES_FILE}; evaluate the run to {horizon} loops first")
        outcomes = read_samples(where)
        if outcomes[0].correct.shape[1] != horizon:
            raise LooplabError(f"{where} reads {outcomes[0].correct.shape[1]} loops, the protocol {horizon}")
        s = summarize(outcomes, config.task.train_max, flip_from=FLIP_FROM)
        ood = [o for o in outcomes if o.length > config.task.train_max]
        halting = [h for h in s["halting"].values() if h is not None]
        rows.append(
            {
                "run_id": run_dir.name,
                "arm": config.schedule.name,
                "seed": config.run.seed,
                "steps": config.train.steps,
                "horizon": horizon,
                **{k: s[k] for k in ("oracle_id", "oracle_ood", "policy_id", "policy_ood", "gap", "front90")},
                "flip_rate": s["flip_rate"],
                "flip_pairs": s["counts"]["flip_pairs"],
                "policy_depth_ood": float(np.mean([o.policy_depth.mean() for o in ood])),
                "halting_depth": float(np.mean([h["mean_depth"] for h in halting])) if halting else math.nan,
                "halting_entropy": float(np.mean([h["entropy"] for h in halting])) if halting else math.nan,
                "block_evals": block_evals,
            }
        )
        curves += [
            {"run_id": run_dir.name, "horizon": horizon, "loops": k, "flip_rate": v}
            for k, v in enumerate(s["flip_curve"], start=1)
        ]
    return rows, curves


@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """Every run of ``sweep_dirs`` (their ``runs/*``) as rows of ``out/runs.csv`` and ``out/flip_curves.csv``."""
    rows, curves = [], []
    for sweep_dir in sweep_dirs:
        run_dirs = sorted(p for p in (Path(sweep_dir) / "runs").glob("*") if (p / "config.toml").is_file())
        if not run_dirs:
            raise LooplabError(f"{sweep_dir}: no run dirs under runs/")
        for run_dir in run_dirs:
            more_rows, more_curves = run_rows(run_dir)
            rows += more_rows
            curves += more_curves
    frame = pd.DataFrame(rows).sort_values(["steps", "horizon", "arm", "seed"], ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / RUNS_FILE, index=False)
    pd.DataFrame(curves).to_csv(out / CURVES_FILE, index=False)
    plot_flip_curves(out)
    return frame


def plot_flip_curves(folder: Path) -> Path:
    """``flips.png``: f(K) per arm (main cell) at both horizons, mean over seeds with its 95 % t-band."""
    from looplab.plotting import color_for, pyplot, save_figure

    runs, curves = pd.read_csv(folder / RUNS_FILE), pd.read_csv(folder / CURVES_FILE)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(HORIZONS), figsize=(10, 3.6), sharey=True)
    for axis, horizon in zip(axes, HORIZONS):
        main = runs[(runs["steps"] == MAIN_STEPS) & (runs["horizon"] == horizon)]
        part = curves[(curves["horizon"] == horizon) & curves["run_id"].isin(main["run_id"])]
        part = part.merge(main[["run_id", "arm"]], on="run_id")
        for arm in [a for a in ARMS if a in set(part["arm"])]:
            by_k = part[part["arm"] == arm].groupby("loops")["flip_rate"]
            stats = pd.DataFrame([seed_stats(100 * v.to_numpy()) for _, v in by_k], index=list(by_k.groups))
            color = color_for(arm, ARMS)
            axis.plot(stats.index, stats["mean"], color=color, label=f"{LABELS[arm]} (n = {int(stats['n'].max())})")
            band = stats[["ci_lo", "ci_hi"]].clip(0, 100)  # a rate's interval stays inside [0, 100] %
            axis.fill_between(stats.index, band["ci_lo"], band["ci_hi"], color=color, alpha=0.15, linewidth=0)
        axis.axvline(FLIP_FROM, color="grey", linestyle="--", linewidth=0.8)
        axis.set(xlabel="K (loops)", title=f"read to {horizon} loops")
    axes[0].set_ylabel(r"flip rate $\Pr[\hat y_{K+1} \neq \hat y_K]$ (%)")
    if axes[-1].get_legend_handles_labels()[0]:
        axes[-1].legend(fontsize=7, title="mean, band: 95 % t-interval (clipped to [0, 100])", title_fontsize=7)
    fig.suptitle("Dyck-1, OOD samples, 600 steps; dashed: training depth 10")
    path = folder / "flips.png"
    save_figure(fig, path)
    return path


# ----------------------------------------------------------------------------- formatting


def _runs(results_dir: Path) -> pd.DataFrame:
    return pd.read_csv(Path(results_dir) / STUDY / RUNS_FILE)


def _cell(values, scale: float = 100.0, digits: int = 1, bounds=(-math.inf, math.inf)) -> str:
    """ "mean ± std [t-interval, clipped to ``bounds`` (the values' range, unscaled)]" over the finite
    values; "n/a (0 of N)" when none is defined."""
    values = np.asarray(values, dtype=float)
    stats = seed_stats(scale * values)
    if stats["n"] == 0:
        return f"n/a (0 of {values.size})"
    stats["ci_lo"], stats["ci_hi"] = max(stats["ci_lo"], scale * bounds[0]), min(stats["ci_hi"], scale * bounds[1])
    mean, std, lo, hi = (f"{stats[k]:.{digits}f}" for k in ("mean", "std", "ci_lo", "ci_hi"))
    text = f"{mean} ± {std} [{lo}, {hi}]"
    return text if stats["n"] == values.size else f"{text} (n = {stats['n']} of {values.size})"


def _std_cell(values) -> str:
    """The sample std (pp) with its χ² 95 % interval (exact under normality)."""
    values = 100 * np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return chi2_cell(values.size, values.std(ddof=1) if values.size > 1 else math.nan)


def _mean(values, digits: int = 1, scale: float = 1.0) -> str:
    values = scale * np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    return "n/a" if finite.size == 0 else f"{finite.mean():.{digits}f}"


def _metric_cell(part: pd.DataFrame, arm: str, column: str) -> str:
    """:func:`_cell` of one arm's ``column``, its interval clipped to what the metric can take (a Gap's
    per schedule: :func:`~looplab.studies.earlier.gap_range`)."""
    if column == "gap":
        low, high = gap_range(arm)
        return _cell(part[column], bounds=(low / 100, high / 100))
    return _cell(part[column], bounds=metric_range(column))


def _cell_of(rows: pd.DataFrame, arm: str, column: str) -> pd.Series:
    return rows.loc[rows["arm"] == arm, column]


def _slice(results_dir: Path, steps: int, horizon: int) -> pd.DataFrame:
    runs = _runs(results_dir)
    return runs[(runs["steps"] == steps) & (runs["horizon"] == horizon)]


def arms_table(rows: pd.DataFrame) -> str:
    """One line per arm: seeds, Oracle ID / OOD, Std, Policy OOD, Gap, flip rate, Front@90, depths, cost."""
    body = []
    for arm in [a for a in ARMS if a in set(rows["arm"])]:
        part = rows[rows["arm"] == arm]
        body.append(
            [
                LABELS[arm],
                str(len(part)),
                _metric_cell(part, arm, "oracle_id"),
                _metric_cell(part, arm, "oracle_ood"),
                _std_cell(part["oracle_ood"]),
                _metric_cell(part, arm, "policy_ood"),
                _metric_cell(part, arm, "gap"),
                _metric_cell(part, arm, "flip_rate"),
                _cell(part["front90"], scale=1.0),
                _mean(part["policy_depth_ood"]),
                _mean(part["block_evals"], 2),
            ]
        )
    header = [
        "arm",
        "seeds",
        "Oracle ID (%)",
        "Oracle OOD (%)",
        "Std (pp) [χ²]",
        "Policy OOD (%)",
        "Gap (pp)",
        f"flip rate, K ≥ {FLIP_FROM} (%)",
        "Front@90",
        "policy depth (OOD)",
        "block evals / step",
    ]
    return markdown_table(header, body)


def arm_effect(rows: pd.DataFrame, reference: str, arm: str) -> Effect:
    """The effect test of ``arm`` against ``reference`` on these rows (Gap in pp)."""
    return effect(
        _cell_of(rows, reference, "oracle_ood"),
        _cell_of(rows, arm, "oracle_ood"),
        100 * _cell_of(rows, reference, "gap"),
        100 * _cell_of(rows, arm, "gap"),
    )


def _effect_cells(result: Effect) -> list[str]:
    return [
        f"{result.seeds[0]} / {result.seeds[1]}",
        f"{result.gap_difference:.1f}",
        f"[{result.gap_welch[0]:.1f}, {result.gap_welch[1]:.1f}]",
        f"[{result.gap_bootstrap[0]:.1f}, {result.gap_bootstrap[1]:.1f}]",
        f"{result.ratio:.2f}",
        f"[{result.ratio_f[0]:.2f}, {result.ratio_f[1]:.2f}]",
        f"[{result.ratio_bootstrap[0]:.2f}, {result.ratio_bootstrap[1]:.2f}]",
        f"{result.brown_forsythe_p:.3f}",
        f"**{result.verdict}**" if result.verdict == "reproduced" else result.verdict,
    ]


EFFECT_HEADER = [
    "comparison",
    "seeds",
    "Gap diff. (pp)",
    "Welch 95 %",
    "bootstrap 95 %",
    "std ratio",
    "F 95 %",
    "bootstrap 95 %",
    "Brown–Forsythe p",
    "verdict",
]


def effects_table(rows: pd.DataFrame) -> str:
    """Every arm against fixed, and window against matched, by the protocol's rule."""
    present = set(rows["arm"])
    pairs = [(ref, other) for ref, other in COMPARISONS if {ref, other} <= present]
    body = [[f"{LABELS[other]} vs {LABELS[ref]}", *_effect_cells(arm_effect(rows, ref, other))] for ref, other in pairs]
    return markdown_table(EFFECT_HEADER, body)


def _carrier(tied: bool, stochastic: bool) -> str:
    return {
        (True, False): "tying depth to length",
        (False, True): "stochastic depth",
        (True, True): "either (both pass)",
        (False, False): "neither",
    }[(tied, stochastic)]


def ablation_table(rows: pd.DataFrame) -> str:
    """Per half of the effect: does matched (tied, deterministic) or fixed_window (stochastic, untied) pass it?"""
    tied, stochastic = arm_effect(rows, "fixed", "matched"), arm_effect(rows, "fixed", "fixed_window")
    on_top = arm_effect(rows, "matched", "window")
    body = [
        ["Gap", _yes(tied.gap_holds), _yes(stochastic.gap_holds), _yes(on_top.gap_holds)]
        + [_carrier(tied.gap_holds, stochastic.gap_holds)],
        ["Std", _yes(tied.std_holds), _yes(stochastic.std_holds), _yes(on_top.std_holds)]
        + [_carrier(tied.std_holds, stochastic.std_holds)],
    ]
    header = [
        "half",
        "tying alone (matched vs fixed)",
        "stochastic alone (fixed window vs fixed)",
        "stochastic on top of tying (window vs matched)",
        "carried by",
    ]
    return markdown_table(header, body)


def _yes(holds: bool) -> str:
    return "holds" if holds else "does not hold"


def long_table(results_dir: Path, horizon: int) -> str:
    """Fixed, window and RL-Halting at 600 steps (seeds 100–107, the paired subset) and at 2400 steps."""
    runs = _runs(results_dir)
    runs = runs[runs["horizon"] == horizon]
    long = runs[runs["steps"] == LONG_STEPS]
    seeds = sorted(set(long["seed"]))
    body = []
    for arm in [a for a in ARMS if a in set(long["arm"])]:
        for steps in (MAIN_STEPS, LONG_STEPS):
            part = runs[(runs["steps"] == steps) & (runs["arm"] == arm) & runs["seed"].isin(seeds)]
            body.append(
                [
                    LABELS[arm],
                    str(steps),
                    str(len(part)),
                    _metric_cell(part, arm, "oracle_ood"),
                    _std_cell(part["oracle_ood"]),
                    _metric_cell(part, arm, "gap"),
                    _metric_cell(part, arm, "flip_rate"),
                    _mean(part["halting_entropy"], 2),
                ]
            )
    header = [
        "arm",
        "steps",
        "seeds",
        "Oracle OOD (%)",
        "Std (pp) [χ²]",
        "Gap (pp)",
        f"flip rate, K ≥ {FLIP_FROM} (%)",
        "halting entropy (nats)",
    ]
    return markdown_table(header, body)


def long_effects_table(results_dir: Path, horizon: int) -> str:
    rows = _slice(results_dir, LONG_STEPS, horizon)
    body = [
        [f"{LABELS[arm]} vs {LABELS['fixed']}", *_effect_cells(arm_effect(rows, "fixed", arm))] for arm in CLAIM_ARMS
    ]
    return markdown_table(EFFECT_HEADER, body)


def flip_curve_table(results_dir: Path, horizon: int) -> str:
    """Mean over seeds of each arm's flip curve f(K) (OOD samples) at a few K, main cell."""
    runs = _slice(results_dir, MAIN_STEPS, horizon)
    curves = pd.read_csv(Path(results_dir) / STUDY / CURVES_FILE)
    curves = curves[(curves["horizon"] == horizon) & curves["run_id"].isin(runs["run_id"])]
    curves = curves.merge(runs[["run_id", "arm"]], on="run_id")
    ks = [k for k in (1, 5, 9, 10, 12, 14, 20, 25, 29) if k < horizon]
    body = []
    for arm in [a for a in ARMS if a in set(runs["arm"])]:
        part = curves[curves["arm"] == arm]
        body.append([LABELS[arm], *(_mean(part.loc[part["loops"] == k, "flip_rate"], 1, 100) for k in ks)])
    return markdown_table(["arm", *(f"K = {k}" for k in ks)], body)


# ----------------------------------------------------------------------------- page blocks

for _horizon in HORIZONS:

    @register_block(f"{STUDY}/arms-{_horizon}")
    def _arms(results_dir: Path, horizon: int = _horizon) -> str:
        return arms_table(_slice(results_dir, MAIN_STEPS, horizon))

    @register_block(f"{STUDY}/effects-{_horizon}")
    def _effects(results_dir: Path, horizon: int = _horizon) -> str:
        return effects_table(_slice(results_dir, MAIN_STEPS, horizon))

    @register_block(f"{STUDY}/ablation-{_horizon}")
    def _ablation(results_dir: Path, horizon: int = _horizon) -> str:
        return ablation_table(_slice(results_dir, MAIN_STEPS, horizon))

    @register_block(f"{STUDY}/long-{_horizon}")
    def _long(results_dir: Path, horizon: int = _horizon) -> str:
        return long_table(results_dir, horizon)

    @register_block(f"{STUDY}/long-effects-{_horizon}")
    def _long_effects(results_dir: Path, horizon: int = _horizon) -> str:
        return long_effects_table(results_dir, horizon)

    @register_block(f"{STUDY}/flips-{_horizon}")
    def _flips(results_dir: Path, horizon: int = _horizon) -> str:
        return flip_curve_table(results_dir, horizon)
