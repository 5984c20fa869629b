"""Holm's step-down beside the STARS studies' unadjusted decisions (stars-finetune, stars-stabilisers).

Every rule of these protocols reads a 95 % Student-t interval (Welch's for a difference of seed
means, one-sample for ρ against 1) and names a direction when the interval excludes the null, else
"not resolved". The test behind each interval rejects exactly when the interval excludes the null,
so a decision has a p-value: the one-sided p in the direction the data lie, doubled (the two-sided
p), below α exactly when the rule names a direction. :func:`decided` checks that the p-values decide
as the rule does; :func:`holm_block` renders Holm's adjustment (:func:`looplab.report.effect.holm`)
over every decision of a page beside the rule's verdicts. The pages keep the protocols' unadjusted
verdicts (their rules name no correction); Holm's are shown beside them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from looplab.report.effect import ALPHA, holm, welch_p
from looplab.report.pages import markdown_table
from looplab.studies.prose import holm_cell, holm_summary, p_cell, split_decision

#: the verdict a rule gives when its interval does not exclude the null
UNRESOLVED = "not resolved"


def direction_p(a, b) -> float:
    """p of mean(a) ≠ mean(b) by Welch's t-test: 2 × the one-sided p in the direction the means lie
    (< α ⟺ the Welch 95 % interval excludes 0); NaN below two values a side."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return float("nan")
    return min(welch_p(a, b), welch_p(b, a))


def mean_p(values, null: float) -> float:
    """p of mean(values) ≠ ``null`` by the one-sample t-test, two-sided (< α ⟺ the Student-t 95 % interval
    excludes ``null``); NaN below two values. No spread: 0 when the mean differs from ``null``, else 1."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return float("nan")
    if np.ptp(values) == 0:
        return 0.0 if values[0] != null else 1.0
    return float(scipy_stats.ttest_1samp(values, null).pvalue)


@dataclass(frozen=True)
class Decided:
    """One decision of a page: the rule's line, its p-value and its Holm-adjusted p."""

    line: str
    p: float
    holm_p: float = float("nan")

    @property
    def verdict(self) -> str:
        return split_decision(self.line)[2]

    @property
    def resolved(self) -> bool:
        """Whether the rule names a direction (its verdict is neither "not resolved" nor "n/a")."""
        return self.verdict != UNRESOLVED and not self.verdict.startswith("n/a")

    @property
    def holm_verdict(self) -> str:
        """The rule's verdict when Holm keeps the rejection; "not resolved" when it does not."""
        return self.verdict if not self.resolved or self.holm_p < ALPHA else UNRESOLVED


def decided(lines_and_p: list[tuple[str, float]]) -> list[Decided]:
    """The decisions with Holm's adjusted p over all of them (m = their number); raises when a p-value
    decides unlike its rule (p < α but "not resolved", or a direction with p ≥ α)."""
    found = [Decided(line, p) for line, p in lines_and_p]
    for d in found:
        if (np.isfinite(d.p) and d.p < ALPHA) != d.resolved:
            raise ValueError(f"the p-value ({d.p:.4g}) decides unlike the rule: {d.line}")
    adjusted, _ = holm([d.p for d in found])
    return [Decided(d.line, d.p, float(q)) for d, q in zip(found, adjusted)]


def _label(question: str, evidence: str) -> str:
    """A decision's name: its question and what it compares ("stars − lognormal, exact match at 32 loops")."""
    if " − " not in evidence and " vs " not in evidence:
        return question
    compared = re.split(r" [-+−]\d", evidence)[0]
    return f"{question}: {compared}"


def holm_block(found: list[Decided]) -> str:
    """Every decision: its p unadjusted and after Holm, the rule's verdict and Holm's (bold where they differ);
    then the counts and the decisions Holm changes."""
    body = []
    for d in found:
        question, evidence, _ = split_decision(d.line)
        body.append(
            [
                _label(question, evidence),
                p_cell(d.p),
                p_cell(d.holm_p),
                d.verdict,
                holm_cell(d.verdict, d.holm_verdict),
            ]
        )
    header = ["decision", "p", "p after Holm", "verdict (rule)", "verdict (Holm)"]
    changed = [d for d in found if d.holm_verdict != d.verdict]
    summary = holm_summary(
        len(found),
        sum(d.resolved for d in found),
        sum(d.resolved and d.holm_p < ALPHA for d in found),
        [f"{_label(*split_decision(d.line)[:2])} ({d.verdict} → {d.holm_verdict})" for d in changed],
        resolved="name a direction",
        head=f"Holm changes {len(changed)}: ",
    )
    return markdown_table(header, body) + "\n\n" + summary


def after_holm(found: list[Decided], line: str) -> str:
    """ " (after Holm over the page's m decisions: not resolved)" when Holm changes ``line``'s verdict, else ""."""
    d = next(d for d in found if d.line == line)
    if d.holm_verdict == d.verdict:
        return ""
    return f" (after Holm over the page's {len(found)} decisions: {d.holm_verdict})"
