"""The confirmatory stopping study's verdicts as sentences (docs/results/stopping-confirm.md).

Every statement of the page that reports a rule's decision, a difference, an interval or a count is
one of these blocks, rendered from ``runs.csv`` by the rule that decides it, so the prose cannot
say more than the rule. The page's verdicts are the frozen protocol's, unadjusted; beside them,
Holm's step-down (:func:`looplab.report.effect.holm`) over every half-decision the page makes, with
each half's p-value the largest of its tests' (:func:`looplab.report.effect.effect_p_values`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats

from looplab.report.aggregate import t_interval
from looplab.report.effect import ALPHA, Effect, EffectP, comparison_line, effect_p_values, holm
from looplab.report.pages import markdown_table, register_block
from looplab.studies.prose import holm_cell, names, p_cell, span
from looplab.studies.stopping.confirm import (
    ARMS,
    CLAIM_ARMS,
    COMPARISONS,
    CURVES_FILE,
    FLIP_FROM,
    HORIZONS,
    LABELS,
    LONG_STEPS,
    MAIN_STEPS,
    RUNS_FILE,
    STUDY,
    _carrier,
    _cell_of,
    _runs,
    _slice,
    arm_effect,
)
from looplab.tasks import make_task

TASK = "dyck1"
OOD_LENGTHS = (12, 16, 20, 25, 30)  # the protocol's OOD lengths (PROTOCOL.md, "Task and model")
TIED = ("matched", "window", "multi_depth")  # the arms whose test depth is T(n) (PROTOCOL.md, "Arms")
HALTING = ("rl_halting", "pondernet")  # the arms with a learned halting distribution


# ----------------------------------------------------------------------------- the decisions


@dataclass(frozen=True)
class Decision:
    """One comparison of the page: the rule's effect test, its p-values and the Holm-adjusted halves."""

    steps: int
    horizon: int
    reference: str
    arm: str
    effect: Effect
    p: EffectP
    gap_holm: float
    std_holm: float

    @property
    def name(self) -> str:
        return f"{LABELS[self.arm]} vs {LABELS[self.reference]}"

    @property
    def holm_gap_holds(self) -> bool:
        return self.gap_holm < ALPHA

    @property
    def holm_std_holds(self) -> bool:
        return self.std_holm < ALPHA

    @property
    def holm_verdict(self) -> str:
        return verdict_of(self.holm_gap_holds, self.holm_std_holds, self.effect)


def verdict_of(gap_holds: bool, std_holds: bool, result: Effect) -> str:
    """The verdict the rule gives for these two halves (:attr:`Effect.verdict`'s words)."""
    if result.few:
        return result.verdict
    return {(True, True): "reproduced", (True, False): "Gap only", (False, True): "Std only"}.get(
        (gap_holds, std_holds), "not reproduced"
    )


def comparisons() -> list[tuple[int, int, str, str]]:
    """(steps, horizon, reference, arm) of every comparison the page decides, in page order."""
    main = [(MAIN_STEPS, h, ref, arm) for h in HORIZONS for ref, arm in COMPARISONS]
    return main + [(LONG_STEPS, h, "fixed", arm) for h in HORIZONS for arm in CLAIM_ARMS]


def decisions(results_dir: Path) -> list[Decision]:
    """Every comparison of the page with its Holm-adjusted halves (m = 2 × the comparisons)."""
    path = Path(results_dir) / STUDY / RUNS_FILE
    status = path.stat()
    return _decisions(str(path), status.st_mtime_ns, status.st_size)


@functools.lru_cache(maxsize=4)
def _decisions(path: str, mtime_ns: int, size: int) -> list[Decision]:
    """:func:`decisions` for one version of ``runs.csv`` (its bootstraps take seconds; several blocks read it)."""
    results_dir = Path(path).parents[1]
    tests = []
    for steps, horizon, reference, arm in comparisons():
        rows = _slice(results_dir, steps, horizon)
        result = arm_effect(rows, reference, arm)
        p = effect_p_values(*_values(rows, reference, arm))
        if (p.gap < ALPHA, p.std < ALPHA) != (result.gap_holds, result.std_holds):
            raise ValueError(
                f"{arm} vs {reference} at {horizon} loops, {steps} steps: the p-values decide unlike the rule"
            )
        tests.append((steps, horizon, reference, arm, result, p))
    adjusted, _ = holm([t[5].gap for t in tests] + [t[5].std for t in tests])
    m = len(tests)
    return [Decision(*t, gap_holm=float(adjusted[i]), std_holm=float(adjusted[m + i])) for i, t in enumerate(tests)]


def _values(rows: pd.DataFrame, reference: str, arm: str) -> tuple[pd.Series, ...]:
    """Oracle OOD (fractions) and Gap (pp) of both arms: what :func:`arm_effect` tests."""
    ood = [_cell_of(rows, a, "oracle_ood") for a in (reference, arm)]
    return ood[0], ood[1], 100 * _cell_of(rows, reference, "gap"), 100 * _cell_of(rows, arm, "gap")


def _find(found: list[Decision], steps: int, horizon: int, reference: str, arm: str) -> Decision:
    return next(d for d in found if (d.steps, d.horizon, d.reference, d.arm) == (steps, horizon, reference, arm))


def holm_family(found: list[Decision]) -> list[Decision]:
    """The decisions Holm is run over for the claim alone: the protocol's two claim comparisons."""
    return [
        d
        for d in found
        if d.steps == MAIN_STEPS and d.horizon == min(HORIZONS) and d.reference == "fixed" and d.arm in CLAIM_ARMS
    ]


def claim_holm(found: list[Decision]) -> dict[str, str]:
    """Arm → its verdict after Holm over the claim's own half-decisions (2 comparisons × 2 halves)."""
    family = holm_family(found)
    _, holds = holm([d.p.gap for d in family] + [d.p.std for d in family])
    m = len(family)
    return {d.arm: verdict_of(bool(holds[i]), bool(holds[m + i]), d.effect) for i, d in enumerate(family)}


# ----------------------------------------------------------------------------- wording


def num(value: float, digits: int = 1) -> str:
    """A number as prose prints it: a true minus sign."""
    return f"{value:.{digits}f}".replace("-", "−")


def interval(pair: tuple[float, float], digits: int = 1) -> str:
    return f"[{num(pair[0], digits)}, {num(pair[1], digits)}]"


def _sentence(parts: list[str]) -> str:
    """``parts`` joined by semicolons, the first word capitalised."""
    text = "; ".join(parts)
    return text[:1].upper() + text[1:]


def _carried(tied: Decision, stochastic: Decision, half: str, holm: bool = False) -> str:
    """Which factor carries ``half`` ("gap" or "std"): the ablation rule on matched and fixed window."""
    if holm:
        return _carrier(getattr(tied, f"holm_{half}_holds"), getattr(stochastic, f"holm_{half}_holds"))
    return _carrier(getattr(tied.effect, f"{half}_holds"), getattr(stochastic.effect, f"{half}_holds"))


def _holds(flag: bool) -> str:
    return "holds" if flag else "does not hold"


def _gap_words(result: Effect) -> str:
    welch, bootstrap = interval(result.gap_welch), interval(result.gap_bootstrap)
    return f"{num(result.gap_difference)} pp (Welch {welch}, bootstrap {bootstrap})"


def _std_words(result: Effect) -> str:
    return (
        f"{num(result.ratio, 2)} (F {interval(result.ratio_f, 2)}, bootstrap {interval(result.ratio_bootstrap, 2)}, "
        f"Brown–Forsythe p {_p_words(result.brown_forsythe_p)})"
    )


def _p_words(value: float) -> str:
    """ "= 0.021", "< 0.001" or "n/a": a p-value as a sentence states it."""
    text = p_cell(value)
    return text if text.startswith(("<", "n/a")) else f"= {text}"


def _mean(rows: pd.DataFrame, arm: str, column: str, scale: float = 100.0) -> float:
    return float(scale * _cell_of(rows, arm, column).mean())


def _std(rows: pd.DataFrame, arm: str, column: str = "oracle_ood") -> float:
    return float(100 * _cell_of(rows, arm, column).std(ddof=1))


# ----------------------------------------------------------------------------- blocks


@register_block(f"{STUDY}/verdict-claims")
def claims_block(results_dir: Path) -> str:
    """The paper's claim at the primary read: window and RL-Halting against fixed, every number of the rule."""
    found = decisions(results_dir)
    horizon = min(HORIZONS)
    rows = _slice(results_dir, MAIN_STEPS, horizon)
    small = claim_holm(found)
    lines = []
    for arm in CLAIM_ARMS:
        d = _find(found, MAIN_STEPS, horizon, "fixed", arm)
        e = d.effect
        lines.append(
            f"- **{LABELS[arm]}: {e.verdict}** by the frozen rule; after Holm, {small[arm]} over the claim's "
            f"{2 * len(holm_family(found))} half-decisions and {d.holm_verdict} over the page's {2 * len(found)}. "
            f"Gap {num(_mean(rows, arm, 'gap'))} ± {num(_std(rows, arm, 'gap'))} pp against fixed's "
            f"{num(_mean(rows, 'fixed', 'gap'))} ± {num(_std(rows, 'fixed', 'gap'))}: difference {_gap_words(e)}, "
            f"Gap half {_holds(e.gap_holds)}. Seed std of Oracle OOD {num(_std(rows, arm))} pp against fixed's "
            f"{num(_std(rows, 'fixed'))}: ratio {_std_words(e)}, Std half {_holds(e.std_holds)}."
        )
    return "\n".join(lines)


ABLATION = (
    ("fixed", "matched", "tying alone (matched vs fixed)"),
    ("fixed", "fixed_window", "stochastic depth alone (fixed window vs fixed)"),
    ("matched", "window", "stochastic depth on top of tying (window vs matched)"),
)


@register_block(f"{STUDY}/verdict-ablation")
def ablation_block(results_dir: Path) -> str:
    """Which factor carries each half, at both reads: the protocol's ablation reading, unadjusted and after Holm."""
    found = decisions(results_dir)
    lines = []
    for horizon in HORIZONS:
        rows = _slice(results_dir, MAIN_STEPS, horizon)
        tied, stochastic, on_top = (_find(found, MAIN_STEPS, horizon, ref, arm) for ref, arm, _ in ABLATION)
        gap_parts = [
            f"{words}: {_gap_words(d.effect)}, {_holds(d.effect.gap_holds)}"
            for d, (_, _, words) in zip((tied, stochastic, on_top), ABLATION)
        ]
        fixed_gap, left = _mean(rows, "fixed", "gap"), _mean(rows, "fixed_window", "gap")
        lines.append(
            f"- {horizon} loops, **Gap half carried by: {_carried(tied, stochastic, 'gap')}** "
            f"(after Holm: {_carried(tied, stochastic, 'gap', holm=True)}). "
            + _sentence(gap_parts)
            + f". Fixed window removes {num(stochastic.effect.gap_difference)} of fixed's {num(fixed_gap)} pp "
            f"and keeps a Gap of {num(left)} pp."
        )
        std_parts = [
            f"{words}: ratio {_std_words(d.effect)}, {_holds(d.effect.std_holds)}"
            for d, (_, _, words) in zip((tied, stochastic, on_top), ABLATION)
        ]
        lines.append(
            f"- {horizon} loops, **Std half carried by: {_carried(tied, stochastic, 'std')}** "
            f"(after Holm: {_carried(tied, stochastic, 'std', holm=True)}). " + _sentence(std_parts) + "."
        )
    others = [
        f"{LABELS[arm]} {_find(found, MAIN_STEPS, h, 'fixed', arm).effect.verdict} at {h} loops"
        for arm in ("multi_depth", "pondernet")
        for h in HORIZONS
    ]
    lines.append("- Beside them, against fixed: " + "; ".join(others) + ".")
    return "\n".join(lines)


def _depths_at(horizon: int) -> list[int]:
    """The depth a T(n)-tied arm reads each OOD length at: min(T(n), horizon)."""
    steps = make_task(TASK).steps(torch.tensor(OOD_LENGTHS)).tolist()
    return [min(int(s), horizon) for s in steps]


@register_block(f"{STUDY}/verdict-horizon")
def horizon_block(results_dir: Path) -> str:
    """Where each arm reads, RL-Halting's halting distribution, and what the 30-loop read decides."""
    found = decisions(results_dir)
    runs = _runs(results_dir)
    main = runs[runs["steps"] == MAIN_STEPS]
    depth = {h: main[main["horizon"] == h].groupby("arm")["policy_depth_ood"] for h in HORIZONS}
    reads = {h: _depths_at(h) for h in HORIZONS}
    for h in HORIZONS:  # the tied arms' depths in the CSV are the protocol's min(T(n), horizon)
        for arm in TIED:
            if not np.allclose(depth[h].get_group(arm), np.mean(reads[h])):
                raise ValueError(f"{arm} at {h} loops: policy depth differs from the mean of min(T(n), {h})")
    first, last = min(HORIZONS), max(HORIZONS)
    at_horizon = {h: sum(r == h for r in reads[h]) for h in HORIZONS}
    tied_words = names([LABELS[a] for a in TIED])

    def all_at_horizon(arm: str, h: int) -> str:
        values = depth[h].get_group(arm)
        return f"{int((values == h).sum())} of {len(values)}"

    halting = " and ".join(
        f"{LABELS[a]} {num(depth[first].get_group(a).mean())} / {num(depth[last].get_group(a).mean())} "
        f"(every OOD sample read at the horizon in {all_at_horizon(a, first)} runs at {first} loops, "
        f"{all_at_horizon(a, last)} at {last})"
        for a in HALTING
    )
    lines = [
        f"- Policy depth at the OOD lengths (mean over runs), at {first} / {last} loops: fixed "
        f"{num(depth[first].get_group('fixed').mean())} / {num(depth[last].get_group('fixed').mean())}; {tied_words} "
        f"{num(np.mean(reads[first]))} / {num(np.mean(reads[last]))}, the mean of min(T(n), horizon) = "
        f"{', '.join(map(str, reads[first]))} / {', '.join(map(str, reads[last]))} over n = "
        f"{', '.join(map(str, OOD_LENGTHS))}: they read {at_horizon[first]} of the {len(OOD_LENGTHS)} OOD lengths "
        f"at the horizon at {first} loops and {at_horizon[last]} at {last}; {halting}."
    ]
    rl = main[(main["horizon"] == first) & (main["arm"] == "rl_halting")]
    mode_last = bool((rl["policy_depth_ood"] == first).all())
    lines.append(
        f"- RL-Halting's halting distribution π^({first}), mean over runs and evaluated lengths: "
        f"E[τ] = {num(rl['halting_depth'].mean())} loops, entropy {num(rl['halting_entropy'].mean(), 2)} nats. "
        + (
            f"Its mode (argmax π, the policy depth) is the last loop for every OOD sample, while E[τ] is below "
            f"{first}: the last loop is its mode, not all its mass."
            if mode_last and rl["halting_depth"].mean() < first
            else f"Its policy depth (argmax π) is {num(rl['policy_depth_ood'].mean())} at the OOD lengths."
        )
    )
    rows = {h: _slice(results_dir, MAIN_STEPS, h) for h in HORIZONS}
    tied_30 = [_find(found, MAIN_STEPS, last, "fixed", a) for a in TIED]
    gap_held = [d for d in tied_30 if d.effect.gap_holds]
    words = f"for {names([LABELS[d.arm] for d in gap_held])}" if gap_held else "for none of the length-tied arms"
    lines.append(
        f"- At {last} loops the Gap half holds {words} (differences "
        f"{span([d.effect.gap_difference for d in gap_held or tied_30])} pp, Welch lower ends "
        f"{span([d.effect.gap_welch[0] for d in gap_held or tied_30])}). "
        + " ".join(
            f"{LABELS[a]}'s Gap is {num(_mean(rows[last], a, 'gap'))} ± {num(_std(rows[last], a, 'gap'))} pp against "
            f"fixed's {num(_mean(rows[last], 'fixed', 'gap'))}: difference {_gap_words(d.effect)}, Gap half "
            f"{_holds(d.effect.gap_holds)}."
            for a in HALTING
            for d in [_find(found, MAIN_STEPS, last, "fixed", a)]
        )
    )
    std_failed = [d for d in tied_30 if not d.effect.std_holds]
    rises = ", ".join(
        f"{LABELS[a]} {num(_mean(rows[first], a, 'oracle_ood'))} → {num(_mean(rows[last], a, 'oracle_ood'))} % "
        f"(std {num(_std(rows[first], a))} → {num(_std(rows[last], a))} pp)"
        for a in ("fixed", *TIED)
    )
    others = [
        d for d in (_find(found, MAIN_STEPS, last, "fixed", a) for a in ARMS[1:] if a not in TIED) if d.effect.std_holds
    ]
    lines.append(
        f"- At {last} loops the Std half does not hold for {names([LABELS[d.arm] for d in std_failed]) or 'none'}"
        + (
            f" (ratios {span([d.effect.ratio for d in std_failed], 2)}, F lower ends "
            f"{span([d.effect.ratio_f[0] for d in std_failed], 2)})"
            if std_failed
            else ""
        )
        + f". Oracle OOD from {first} to {last} loops: {rises}. It holds for "
        + (names([f"{LABELS[d.arm]}, ratio {_std_words(d.effect)}" for d in others]) if others else "no other arm")
        + "."
    )
    return "\n".join(lines)


@register_block(f"{STUDY}/committed")
def committed_block(results_dir: Path) -> str:
    """What the committed CSVs hold, and that none holds an accuracy per length."""
    runs = _runs(results_dir)
    curves = pd.read_csv(Path(results_dir) / STUDY / CURVES_FILE)
    per_length = [c for c in runs.columns if any(str(n) in c for n in OOD_LENGTHS)]
    if per_length:
        raise ValueError(f"{RUNS_FILE} has per-length columns {per_length}: say what they show")
    return (
        f"`{STUDY}/{RUNS_FILE}` holds {len(runs)} rows, one per run and read, with "
        f"{', '.join(f'`{c}`' for c in runs.columns)}: Oracle and Policy OOD are means over the "
        f"{len(OOD_LENGTHS)} OOD lengths. `{STUDY}/{CURVES_FILE}` holds {len(curves)} rows, one per run, read and K, "
        "the flip rate over all OOD samples. No committed file holds an accuracy per length, so this page cannot "
        "show what any arm scores at a given OOD length."
    )


@register_block(f"{STUDY}/verdict-flips")
def flips_block(results_dir: Path) -> str:
    """The flip rate per arm at both reads, and matched against fixed (exploratory: no rule decides on it)."""
    lines = []
    for horizon in HORIZONS:
        rows = _slice(results_dir, MAIN_STEPS, horizon)
        means = ", ".join(f"{LABELS[a]} {num(_mean(rows, a, 'flip_rate'))} %" for a in ARMS)
        test = comparison_line(
            "matched against fixed",
            "matched",
            "fixed",
            _cell_of(rows, "matched", "flip_rate"),
            _cell_of(rows, "fixed", "flip_rate"),
            "flip rate",
            "matched flips more often",
            "matched flips less often",
        )
        lines.append(f"- {horizon} loops, K = {FLIP_FROM}..{horizon - 1}: {means}. Exploratory, {test}.")
    return "\n".join(lines)


def _paired(rows: pd.DataFrame, arm: str, column: str, seeds: list[int]) -> str:
    """The change of ``column`` (pp) from MAIN_STEPS to LONG_STEPS over the same seeds: paired t-interval and p."""
    by = {
        s: rows[(rows["steps"] == s) & (rows["arm"] == arm)].set_index("seed")[column] for s in (MAIN_STEPS, LONG_STEPS)
    }
    change = 100 * (by[LONG_STEPS].loc[seeds] - by[MAIN_STEPS].loc[seeds]).to_numpy()
    low, high = t_interval(change)
    p = float(scipy_stats.ttest_1samp(change, 0.0).pvalue)
    word = "up" if low > 0 else "down" if high < 0 else "no change shown"
    signed = num(change.mean()) if change.mean() < 0 else f"+{num(change.mean())}"
    return f"{LABELS[arm]} {signed} pp (paired t {interval((low, high))}, p {_p_words(p)}: {word})"


@register_block(f"{STUDY}/verdict-long")
def long_block(results_dir: Path) -> str:
    """Training 4× longer: the rule at both reads, the paired changes of Gap and Oracle OOD, RL-Halting's policy."""
    found = decisions(results_dir)
    runs = _runs(results_dir)
    seeds = sorted(set(runs.loc[runs["steps"] == LONG_STEPS, "seed"]))
    lines = []
    for horizon in HORIZONS:
        rows = runs[(runs["horizon"] == horizon) & runs["seed"].isin(seeds)]
        long = rows[rows["steps"] == LONG_STEPS]
        parts = []
        for arm in CLAIM_ARMS:
            d = _find(found, LONG_STEPS, horizon, "fixed", arm)
            parts.append(
                f"{LABELS[arm]} **{d.effect.verdict}** (after Holm: {d.holm_verdict}): Gap difference "
                f"{_gap_words(d.effect)}; std of Oracle OOD {num(_std(long, arm))} against fixed's "
                f"{num(_std(long, 'fixed'))} pp, ratio {_std_words(d.effect)}"
            )
        lines.append(f"- {LONG_STEPS} steps, {horizon} loops, {len(seeds)} seeds per arm: " + "; ".join(parts) + ".")
    first = min(HORIZONS)
    rows = runs[(runs["horizon"] == first) & runs["seed"].isin(seeds)]
    for column, words in (("gap", "Gap"), ("oracle_ood", "Oracle OOD")):
        changes = "; ".join(_paired(rows, arm, column, seeds) for arm in ("fixed", *CLAIM_ARMS))
        lines.append(
            f"- {words}, {MAIN_STEPS} → {LONG_STEPS} steps at {first} loops, paired by seed "
            f"({seeds[0]}–{seeds[-1]}; exploratory): {changes}."
        )
    rl = {
        (s, h): runs[
            (runs["steps"] == s) & (runs["horizon"] == h) & (runs["arm"] == "rl_halting") & runs["seed"].isin(seeds)
        ]
        for s in (MAIN_STEPS, LONG_STEPS)
        for h in HORIZONS
    }
    depths = "; ".join(
        f"{num(rl[MAIN_STEPS, h]['policy_depth_ood'].mean())} → {num(rl[LONG_STEPS, h]['policy_depth_ood'].mean())} "
        f"at {h} loops"
        for h in HORIZONS
    )
    lines.append(
        f"- RL-Halting, {MAIN_STEPS} → {LONG_STEPS} steps (seeds {seeds[0]}–{seeds[-1]}, {first} loops): halting "
        f"entropy {num(rl[MAIN_STEPS, first]['halting_entropy'].mean(), 2)} → "
        f"{num(rl[LONG_STEPS, first]['halting_entropy'].mean(), 2)} nats; policy depth at the OOD lengths {depths}; "
        f"Oracle OOD {_mean_std(rl[MAIN_STEPS, first])} → {_mean_std(rl[LONG_STEPS, first])} %."
    )
    return "\n".join(lines)


def _mean_std(rows: pd.DataFrame) -> str:
    """ "mean ± std" of Oracle OOD (%) over RL-Halting's rows."""
    return f"{num(_mean(rows, 'rl_halting', 'oracle_ood'))} ± {num(_std(rows, 'rl_halting'))}"


@register_block(f"{STUDY}/holm")
def holm_block(results_dir: Path) -> str:
    """Every decision of the page: its tests' p-values, each half's p unadjusted and after Holm, both verdicts."""
    found = decisions(results_dir)
    body = [
        [
            d.name,
            str(d.horizon),
            str(d.steps),
            f"{p_cell(d.p.gap_welch)} / {p_cell(d.p.gap_bootstrap)}",
            f"{p_cell(d.p.ratio_f)} / {p_cell(d.p.ratio_bootstrap)} / {p_cell(d.p.brown_forsythe)}",
            f"{p_cell(d.p.gap)} → {p_cell(d.gap_holm)}",
            f"{p_cell(d.p.std)} → {p_cell(d.std_holm)}",
            d.effect.verdict,
            holm_cell(d.effect.verdict, d.holm_verdict),
        ]
        for d in found
    ]
    header = [
        "comparison",
        "loops",
        "steps",
        "Gap: Welch / bootstrap p",
        "Std: F / bootstrap / Brown–Forsythe p",
        "Gap half p → Holm",
        "Std half p → Holm",
        "verdict (rule)",
        "verdict (Holm)",
    ]
    m = 2 * len(found)
    unadjusted = sum(d.effect.gap_holds for d in found) + sum(d.effect.std_holds for d in found)
    adjusted = sum(d.holm_gap_holds for d in found) + sum(d.holm_std_holds for d in found)
    changed = [d for d in found if d.holm_verdict != d.effect.verdict]
    summary = (
        f"{len(found)} comparisons, {m} half-decisions: {unadjusted} halves hold by the rule, {adjusted} after Holm. "
        + (
            f"The verdicts Holm changes ({len(changed)} of {len(found)}): "
            + "; ".join(
                f"{d.name}, {d.horizon} loops, {d.steps} steps: {d.effect.verdict} → {d.holm_verdict}" for d in changed
            )
            + "."
            if changed
            else "Holm changes no verdict."
        )
    )
    return markdown_table(header, body) + "\n\n" + summary


@register_block(f"{STUDY}/citable")
def citable_block(results_dir: Path) -> str:
    """What the page's decisions say, as the sentences one may cite: unadjusted, and after Holm."""
    found = decisions(results_dir)
    first, last = min(HORIZONS), max(HORIZONS)
    small = claim_holm(found)
    claims = [_find(found, MAIN_STEPS, first, "fixed", a) for a in CLAIM_ARMS]
    lines = [
        f"- The paper's claim, {first} loops, {MAIN_STEPS} steps: "
        + "; ".join(
            f"{LABELS[d.arm]} {d.effect.verdict} by the frozen rule, {small[d.arm]} after Holm over the claim's "
            f"{2 * len(claims)} half-decisions, {d.holm_verdict} after Holm over the page's {2 * len(found)}"
            for d in claims
        )
        + "."
    ]
    for horizon in HORIZONS:
        against = [_find(found, MAIN_STEPS, horizon, "fixed", a) for a in ARMS[1:]]
        gap = [LABELS[d.arm] for d in against if d.effect.gap_holds]
        gap_holm = [LABELS[d.arm] for d in against if d.holm_gap_holds]
        std = [LABELS[d.arm] for d in against if d.effect.std_holds]
        std_holm = [LABELS[d.arm] for d in against if d.holm_std_holds]
        lines.append(
            f"- {horizon} loops, against fixed ({len(against)} arms): the Gap half holds for {len(gap)} "
            f"({names(gap) if gap else 'none'}), {len(gap_holm)} after Holm; the Std half for {len(std)} "
            f"({names(std) if std else 'none'}), {len(std_holm)} after Holm"
            + (f" ({names(std_holm)})" if std_holm else "")
            + "."
        )
    for horizon in (first, last):
        tied, stochastic = (_find(found, MAIN_STEPS, horizon, "fixed", a) for a in ("matched", "fixed_window"))
        lines.append(
            f"- Which factor, {horizon} loops: Gap half {_carried(tied, stochastic, 'gap')}, "
            f"Std half {_carried(tied, stochastic, 'std')}; after Holm, Gap half "
            f"{_carried(tied, stochastic, 'gap', holm=True)}, Std half {_carried(tied, stochastic, 'std', holm=True)}."
        )
    long = [_find(found, LONG_STEPS, first, "fixed", a) for a in CLAIM_ARMS]
    lines.append(
        f"- {LONG_STEPS} steps, {first} loops: "
        + "; ".join(f"{LABELS[d.arm]} {d.effect.verdict} (after Holm: {d.holm_verdict})" for d in long)
        + "."
    )
    return "\n".join(lines)
