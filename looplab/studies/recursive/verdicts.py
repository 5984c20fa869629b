"""The recursive-reasoner studies' decisions with p-values, and Holm's step-down over each study's decisions
(docs/results/recursive-*.md).

The frozen rules decide by 95 % intervals (:mod:`looplab.studies.recursive.paper`); each interval has a test
that rejects exactly when the interval clears the rule's line, so every decision has a p-value below
α = 0.05 exactly when the rule gives a verdict other than "not resolved":

    "above" / "below"      Welch's t-test of the difference, two-sided (= 2 × one-sided in the verdict's
                           direction): < α ⟺ the Welch interval excludes 0
    "matches" (±margin)    the two one-sided Welch tests against −margin and +margin (TOST), each doubled,
                           p the larger: < α ⟺ the interval lies within ±margin
    halting on − off       the paired t-test, "costs" 2 × one-sided below 0, "free" the TOST against ±FREE_PP

A decision's p is that of the verdict the rule reached (the smallest of its verdicts' p when it reached
none). :func:`decisions` checks that the p-values decide exactly as the rule does. The pages' verdicts are
the frozen protocols' (unadjusted); Holm's (:func:`looplab.report.effect.holm`) stands beside them: a
decision keeps its verdict after Holm when its adjusted p is below α, else it reads "not resolved".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd

from looplab.report.effect import ALPHA, direction_p, holm, mean_se, one_sided_p, welch_se, within_p
from looplab.report.pages import markdown_table, register_block
from looplab.studies.prose import holm_cell, holm_summary, p_cell, verdict_of
from looplab.studies.recursive.pages import CONFIRM, MAZE, RUNS_FILE, STUDY, _decision_frame, _read
from looplab.studies.recursive.paper import (
    COMPARISONS,
    CONFIRM_COMPARISONS,
    CONFIRM_MATCHES,
    CONFIRM_PAIRED,
    FREE_PP,
    MATCH_PP,
    PAIRED_ARMS,
    PRIMARY,
    TRM_COMPARISON,
    _values,
    decision_lines,
)

UNRESOLVED = "not resolved"


@dataclass(frozen=True)
class Decision:
    """One decision of a page: the rule's line and verdict, its tests' p-values, and Holm's reading."""

    line: str
    verdict: str
    tests: dict[str, float]
    p: float
    holm_p: float = float("nan")

    @property
    def holm_verdict(self) -> str:
        if self.verdict.startswith("n/a"):
            return self.verdict
        return self.verdict if self.holm_p < ALPHA else UNRESOLVED


def _comparison(frame: pd.DataFrame, arm: str, other: str, above: str, below: str, margin: float | None):
    """(verdict, tests) of a Welch comparison by its p-values; None below two seeds a side."""
    a, b = _values(frame, arm, PRIMARY), _values(frame, other, PRIMARY)
    if len(a) < 2 or len(b) < 2:
        return None
    estimate, se, dof = welch_se(a, b)
    tests = {"Welch": direction_p(estimate, se, dof)}
    if margin is not None:
        name = f"TOST ±{margin:g} pp"
        tests[name] = within_p(estimate, se, dof, margin / 100)
        if tests[name] < ALPHA:
            return f"matches (within ±{margin:g} pp)", tests
    if tests["Welch"] < ALPHA:
        return (above if estimate > 0 else below), tests
    return UNRESOLVED, tests


def _paired(frame: pd.DataFrame, arm: str):
    """(verdict, tests) of the halting rule on ``arm`` by its p-values; None below two paired seeds."""
    on = _values(frame, arm, "halting_inference.on_id")
    off = _values(frame, arm, "halting_inference.off_id")
    seeds = on.index.intersection(off.index)
    if len(seeds) < 2:
        return None
    estimate, se, dof = mean_se(on[seeds] - off[seeds])
    tests = {
        "costs (paired t)": min(1.0, 2 * one_sided_p(estimate, se, dof, 0.0, False)),
        f"free (TOST ±{FREE_PP:g} pp)": within_p(estimate, se, dof, FREE_PP / 100),
    }
    if tests["costs (paired t)"] < ALPHA:
        return "halting costs accuracy", tests
    if tests[f"free (TOST ±{FREE_PP:g} pp)"] < ALPHA:
        return "halting is free", tests
    return UNRESOLVED, tests


#: one part of a study's decisions: (label prefix, the rows, comparisons, paired arms, matches)
Part = tuple[str, pd.DataFrame, tuple, tuple, tuple]


def parts(results_dir: Path, study: str) -> list[Part]:
    """The decisions a study's page makes, in the page's order (those of its decisions block)."""
    if study == STUDY:
        return [("", _decision_frame(_read(results_dir, STUDY, RUNS_FILE)), COMPARISONS, PAIRED_ARMS, ())]
    if study == CONFIRM:
        frame = _decision_frame(_read(results_dir, CONFIRM, RUNS_FILE))
        return [("", frame, CONFIRM_COMPARISONS, CONFIRM_PAIRED, CONFIRM_MATCHES)]
    if study == MAZE:
        mazes = _decision_frame(_read(results_dir, MAZE, RUNS_FILE, "maze"))
        sudoku = pd.concat(
            [
                _read(results_dir, MAZE, RUNS_FILE, "sudoku4"),
                _read(results_dir, STUDY, RUNS_FILE).query("arm == 'ds_fixed'"),
            ]
        )
        return [
            ("mazes, ", mazes, COMPARISONS, PAIRED_ARMS, ()),
            ("mazes, ", mazes, (TRM_COMPARISON,), (), ()),
            ("4×4 Sudoku, ", _decision_frame(sudoku), (TRM_COMPARISON,), (), ()),
        ]
    raise KeyError(study)


def part_lines(part: Part) -> list[str]:
    """The rule's decision lines of one part, labelled."""
    prefix, frame, comparisons, paired, matches = part
    return [f"{prefix}{line}" for line in decision_lines(frame, comparisons, paired, matches)]


def _rule_verdict(line: str) -> str:
    """The verdict a decision line gives (a halting line's verdict before its depth and wall time)."""
    return verdict_of(line).split("; ")[0]


def decisions(results_dir: Path, study: str) -> list[Decision]:
    """Every decision of the study's page with its p-values and Holm-adjusted p over all of them; raises
    when the p-values decide unlike the rule."""
    found = []
    for part in parts(results_dir, study):
        _, frame, comparisons, paired, matches = part
        tested = [_comparison(frame, arm, other, above, below, None) for _, arm, other, above, below in comparisons]
        tested += [_comparison(frame, arm, other, above, below, MATCH_PP) for _, arm, other, above, below in matches]
        tested += [_paired(frame, arm) for arm in paired]
        for line, result in zip(part_lines(part), tested):
            rule = _rule_verdict(line)
            if result is None:
                found.append(Decision(line, rule, {}, float("nan")))
                continue
            verdict, tests = result
            if verdict != rule:
                raise ValueError(f"{line}: the p-values give {verdict!r}, the rule {rule!r}")
            chosen = [p for name, p in tests.items() if p < ALPHA] or [min(tests.values())]
            found.append(Decision(line, verdict, tests, float(min(chosen))))
    adjusted, _ = holm([d.p for d in found])
    return [Decision(d.line, d.verdict, d.tests, d.p, float(q)) for d, q in zip(found, adjusted)]


def holm_block(results_dir: Path, study: str) -> str:
    """Every decision of the page: its tests' p-values, its p unadjusted and after Holm, both verdicts."""
    found = decisions(results_dir, study)
    body = [
        [
            line_name(d.line),
            "; ".join(f"{name} {p_cell(p)}" for name, p in d.tests.items()) or "n/a",
            f"{p_cell(d.p)} → {p_cell(d.holm_p)}",
            d.verdict,
            holm_cell(d.verdict, d.holm_verdict),
        ]
        for d in found
    ]
    header = ["decision", "tests' p", "p → Holm", "verdict (rule)", "verdict (Holm)"]
    changed = [d for d in found if d.holm_verdict != d.verdict]
    summary = holm_summary(
        len(found),
        sum(d.verdict != UNRESOLVED and not d.verdict.startswith("n/a") for d in found),
        sum(d.holm_verdict != UNRESOLVED and not d.holm_verdict.startswith("n/a") for d in found),
        [f"{line_name(d.line)}: {d.verdict} → {d.holm_verdict}" for d in changed],
        head=f"The verdicts Holm changes ({len(changed)} of {len(found)}): ",
    )
    return markdown_table(header, body) + "\n\n" + summary


def line_name(line: str) -> str:
    """A decision's name: its question and what it compares ("halting rule: act_bce − q_halt")."""
    question, _, rest = line.partition(": ")
    what = rest.split(",")[0]
    return f"{question}: {what}" if " − " in what else question


for _study in (STUDY, CONFIRM, MAZE):
    register_block(f"{_study}/holm")(partial(holm_block, study=_study))
