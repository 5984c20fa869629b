"""The flat-cache confirmation study's page from its committed reads (its protocol: :mod:`.protocol`).

    python -m looplab.studies.flat_cache_confirm.page [--dir docs/results/flat-cache-confirm]
                                                     [--out docs/results/flat-cache-confirm.md]

Every number comes from the per-seed, per-problem and per-passage reads in ``--dir``; every decision from
the protocol's rule: the equivalence tests (TOST) and the causal contrast (Welch), Holm across the 20.
While fewer than every seed of an arm is read, its decisions read "pending" with the count (the rule is
stated for the full seed set); the rest of the page is described with its counts. A metric with fewer
than two seeds behind it is n/a with its count.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import t_interval
from looplab.report.effect import holm, mean_se, one_sided_p, welch_interval, welch_se
from looplab.studies.flat_cache import page as flat_page
from looplab.studies.flat_cache_confirm import protocol as P

DIR = Path("docs/results/flat-cache-confirm")
PAGE = Path("docs/results/flat-cache-confirm.md")
METRICS = {"em_gap": ("exact-match gap, points", P.EM_MARGIN, 1), "loss_gap": ("loss gap, nats/byte", P.LOSS_MARGIN, 3)}


@dataclass(frozen=True)
class Test:
    """One of the study's decisions: its name, p (NaN while its seeds are not all read), and what it reads."""

    name: str
    p: float
    seeds: int


def tost_p(values, margin: float) -> float:
    """The TOST p of "the mean lies within ±margin": the larger of the two one-sided Student-t p's."""
    mean, se, dof = mean_se(values)
    return max(one_sided_p(mean, se, dof, -margin, True), one_sided_p(mean, se, dof, margin, False))


def per_seed_contrast(gaps: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Each seed's gap averaged over the read depths, for the contrast's two arms."""
    arm, base = P.CONTRAST
    means = gaps.groupby(["arm", "seed"])[metric].mean()
    return means.get(arm, pd.Series(dtype=float)).to_numpy(), means.get(base, pd.Series(dtype=float)).to_numpy()


def tests(gaps: pd.DataFrame) -> list[Test]:
    """The 20 decisions in the protocol's order (18 equivalence tests, 2 contrasts); a test whose arm has
    not every seed read is NaN (Holm counts it as 1: never rejected)."""
    out, full = [], len(P.SEEDS)
    for arm in P.ARMS:
        for loops in P.READ_LOOPS:
            at = gaps[(gaps.arm == arm) & (gaps.loops == loops)]
            for metric, (_, margin, _) in METRICS.items():
                values = at[metric].to_numpy()
                p = tost_p(values, margin) if len(values) == full else math.nan
                out.append(Test(f"{arm} {loops} loops {metric}", p, len(values)))
    for metric in METRICS:
        mine, base = per_seed_contrast(gaps, metric)
        ready = len(mine) == full and len(base) == full
        p = math.nan
        if ready:
            diff, se, dof = welch_se(mine, base)
            p = min(1.0, 2 * min(one_sided_p(diff, se, dof, 0.0, True), one_sided_p(diff, se, dof, 0.0, False)))
        out.append(Test(f"contrast {P.CONTRAST[0]} − {P.CONTRAST[1]} {metric}", p, min(len(mine), len(base))))
    return out


def _cell(values, digits: int) -> str:
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return f"n/a ({_seeds(len(values))})"
    low, high = t_interval(values)
    return f"{values.mean():+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _seeds(count: int) -> str:
    return f"{count} seed{'' if count == 1 else 's'}"


def p_text(value: float) -> str:
    """A p-value as the decisions table shows it: four decimals, "< 1e-4" below that."""
    return "< 1e-4" if value < 1e-4 else f"{value:.4f}"


def tests_said(count: int) -> str:
    """What each p of the decisions table is, what "rejected" rejects, and the correction over ``count``."""
    return (
        f"Each equivalence decision's p is that of two one-sided Student-t tests (TOST) on the per-seed gaps "
        f"(shared − per_loop) against the margins ±{P.EM_MARGIN:g} point of exact match and ±{P.LOSS_MARGIN:g} "
        'nats/byte: the null is that the mean gap lies outside the margin, and "rejected" rejects it, which '
        f"shows equivalence within the margin. Each contrast's p is Welch's two-sided t-test of the difference of "
        f"the two arms' per-seed gaps (null: no difference). Holm's correction runs across the {count} decisions "
        f"at α = {P.ALPHA:g}."
    )


def decisions_table(gaps: pd.DataFrame) -> list[str]:
    """The tests behind the p's (:func:`tests_said`), then each decision: its seeds, p, Holm's p, verdict."""
    found = tests(gaps)
    adjusted, rejected = holm([t.p for t in found], P.ALPHA)
    lines = [tests_said(len(found)), "", "| decision | seeds | p | Holm p | decided |", "|---|---|---|---|---|"]
    for test, p_holm, yes in zip(found, adjusted, rejected):
        if not np.isfinite(test.p):
            lines.append(f"| {test.name} | {test.seeds} of {len(P.SEEDS)} | pending | pending | pending |")
            continue
        lines.append(
            f"| {test.name} | {test.seeds} | {p_text(test.p)} | {p_text(p_holm)} "
            f"| {'rejected' if yes else 'not rejected'} |"
        )
    return lines


def verdicts(gaps: pd.DataFrame) -> list[str]:
    """Per arm: equivalent (all six of its tests rejected after Holm), not shown equivalent, or pending."""
    found = tests(gaps)
    _, rejected = holm([t.p for t in found], P.ALPHA)
    lines = []
    for index, arm in enumerate(P.ARMS):
        mine = found[6 * index : 6 * index + 6]
        if any(not np.isfinite(t.p) for t in mine):
            read = min(t.seeds for t in mine)
            lines.append(f"- **{arm}**: pending ({read} of {len(P.SEEDS)} seeds read).")
        elif all(rejected[6 * index : 6 * index + 6]):
            lines.append(f"- **{arm}**: `shared` is equivalent to `per_loop` within the margins at 4, 8 and 16 loops.")
        else:
            lines.append(f"- **{arm}**: `shared` is not shown equivalent to `per_loop`.")
    contrast = found[-2:]
    if any(not np.isfinite(t.p) for t in contrast):
        lines.append(f"- **contrast {P.CONTRAST[0]} − {P.CONTRAST[1]}**: pending.")
    else:
        changed = [name for t, name, yes in zip(contrast, METRICS, rejected[-2:]) if yes]
        said = f"changes the {' and '.join(changed)}" if changed else "is not shown to change either gap"
        lines.append(f"- **contrast {P.CONTRAST[0]} − {P.CONTRAST[1]}**: training in the view {said}.")
    return lines


def gap_table(gaps: pd.DataFrame) -> list[str]:
    """Per arm and loops: each gap's mean with its 95 % interval, and the seeds whose gap lies past its margin on
    either side (below −margin, above +margin)."""
    em, loss = f"{P.EM_MARGIN:g} point", f"{P.LOSS_MARGIN:g}"
    lines = [
        f"| arm | loops | EM gap, points | seeds below −{em} / above +{em} | loss gap, nats/byte "
        f"| seeds below −{loss} / above +{loss} |",
        "|---|---|---|---|---|---|",
    ]
    for arm in P.ARMS:
        for loops in P.READ_LOOPS:
            at = gaps[(gaps.arm == arm) & (gaps.loops == loops)]
            lines.append(
                f"| {arm} | {loops} | {_cell(at.em_gap, 1)} | {_past(at.em_gap, P.EM_MARGIN)} "
                f"| {_cell(at.loss_gap, 3)} | {_past(at.loss_gap, P.LOSS_MARGIN)} |"
            )
    return lines


def _past(values: pd.Series, margin: float) -> str:
    """How many of ``values`` lie below −margin and above +margin, of how many."""
    return f"{int((values < -margin).sum())} / {int((values > margin).sum())} of {len(values)}"


def earlier_rule(gaps: pd.DataFrame) -> list[str]:
    """Per arm, the earlier studies' non-inferiority rule (every 95 % Student-t upper bound within its margin),
    reported beside the decisions in its own words."""
    lines = []
    for arm in P.ARMS:
        _, reasons = flat_page.verdict(gaps[gaps.arm == arm], P)
        lines.append(f"- {arm}: {'; '.join(reasons)}.")
    return lines


def contrast_lines(gaps: pd.DataFrame) -> list[str]:
    """The causal contrast, described: the difference of per-seed gaps with Welch's 95 % interval."""
    lines = []
    for metric, (label, _, digits) in METRICS.items():
        mine, base = per_seed_contrast(gaps, metric)
        if len(mine) < 2 or len(base) < 2:
            lines.append(f"- {label}: n/a ({len(mine)} and {_seeds(len(base))})")
            continue
        low, high = welch_interval(mine, base)
        lines.append(
            f"- {label}, averaged over the depths: {mine.mean() - base.mean():+.{digits}f} "
            f"[{low:+.{digits}f}, {high:+.{digits}f}] ({len(mine)} and {len(base)} seeds)"
        )
    return lines


def per_problem(problems: pd.DataFrame) -> list[str]:
    """Pooled over seeds: problems right under per_loop and wrong under shared, and the reverse."""
    lines = ["| arm | loops | problem reads | per_loop only | shared only |", "|---|---|---|---|---|"]
    for (arm, loops), at in problems.groupby(["arm", "loops"], sort=False):
        only_exact = int(((at.per_loop == 1) & (at.shared == 0)).sum())
        only_flat = int(((at.shared == 1) & (at.per_loop == 0)).sum())
        lines.append(f"| {arm} | {loops} | {len(at)} | {only_exact} | {only_flat} |")
    return lines


def per_passage(passages: pd.DataFrame) -> list[str]:
    """Pooled over seeds: the per-passage loss gap's mean and standard deviation."""
    lines = ["| arm | loops | passage reads | mean loss gap | SD |", "|---|---|---|---|---|"]
    for (arm, loops), at in passages.groupby(["arm", "loops"], sort=False):
        gap = at.shared - at.per_loop
        lines.append(f"| {arm} | {loops} | {len(at)} | {gap.mean():+.4f} | {gap.std(ddof=1):.4f} |")
    return lines


def exploratory_d256(folder: Path) -> list[str]:
    """The section of the exploratory d 256 reads (:mod:`looplab.studies.flat_cache_confirm.d256`), when they
    are there: per loops, each cache's exact match, loss and memory, and the gaps (one seed: no interval)."""
    path = folder / "exploratory-d256.csv"
    if not path.is_file():
        return []
    reads = pd.read_csv(path).set_index(["loops", "cache"])
    lines = [
        "## Exploratory: the decided recipe at d 256 (chosen after the decision; one seed; no rule)",
        "",
        "The contractive injection with `train.shared_view_weight = 0.5` on the d 256 demo LM "
        "(`generation/kjv_trace_d256`, 1,500 steps, seed 7401), read as the study reads a run "
        "(`python -m looplab.studies.flat_cache_confirm.d256`). One seed gives no interval and decides nothing.",
        "",
        "| loops | exact match, per_loop / shared (%) | EM gap, points | loss, per_loop / shared (nats/byte) "
        "| loss gap | MiB, per_loop / shared |",
        "|---|---|---|---|---|---|",
    ]
    for loops in sorted(reads.index.get_level_values("loops").unique()):
        exact, flat = reads.loc[(loops, "per_loop")], reads.loc[(loops, "shared")]
        em_gap = exact.exact_match - flat.exact_match
        lines.append(
            f"| {loops} | {exact.exact_match:.1f} / {flat.exact_match:.1f} | {em_gap:+.1f} "
            f"| {exact.loss:.3f} / {flat.loss:.3f} | {flat.loss - exact.loss:+.3f} "
            f"| {exact.cache_mib:.2f} / {flat.cache_mib:.2f} |"
        )
    return [*lines, ""]


def write(folder: Path = DIR, out: Path = PAGE) -> str:
    reads = pd.read_csv(folder / "reads.csv")
    gaps = flat_page.gaps(reads, "shared")
    problems, passages = pd.read_csv(folder / "problems.csv"), pd.read_csv(folder / "passages.csv")
    counts = gaps.groupby("arm").seed.nunique().reindex(list(P.ARMS), fill_value=0)
    seeds = ", ".join(f"{arm} {counts[arm]}" for arm in P.ARMS)
    memory = reads.groupby(["cache", "loops"]).cache_mib.mean().unstack("loops")
    text = "\n".join(
        [
            "# Flat-cache confirmation (issue #56)",
            "",
            "Protocol: `looplab/studies/flat_cache_confirm/protocol.py`, committed before the first run. "
            f"Seeds read, of {len(P.SEEDS)} per arm: {seeds}. Generated by "
            "`python -m looplab.studies.flat_cache_confirm.page` from the CSVs beside this page.",
            "",
            "## What the rule decides",
            "",
            *verdicts(gaps),
            "",
            *decisions_table(gaps),
            "",
            "## The gaps (described)",
            "",
            *gap_table(gaps),
            "",
            "## The earlier studies' rule (reported beside, not decided)",
            "",
            *earlier_rule(gaps),
            "",
            "## The causal contrast (described)",
            "",
            *contrast_lines(gaps),
            "",
            "## Per problem and per passage (described)",
            "",
            *per_problem(problems),
            "",
            *per_passage(passages),
            "",
            "## Memory",
            "",
            "Keys and values held while scoring the passages (MiB, mean over runs): "
            + "; ".join(
                f"{cache} {', '.join(f'{memory.loc[cache, loops]:.2f} at {loops}' for loops in memory.columns)}"
                for cache in memory.index
            )
            + ".",
            "",
            *exploratory_d256(folder),
        ]
    )
    out.write_text(text, encoding="utf-8")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DIR)
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args()
    write(args.dir, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
