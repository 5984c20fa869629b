"""The trained-model study's four decisions with p-values, and Holm's step-down over them
(docs/results/mechanistic.md §1).

Each rule reads a 95 % t-interval (Student for rules 1 and 2, Welch for rules 3 and 4) against a line
(0, or 0.5 for rule 2) and says "holds" on the claimed side, "fails" on the other, else "not resolved";
its p-value is the two-sided t-test's against that line (:func:`looplab.report.effect.direction_p`),
below α = 0.05 exactly when the rule resolves the decision. :func:`decisions` checks that the p-values
decide as the rule does. The page's verdicts are the frozen protocol's, unadjusted; Holm's stands beside
them: a decision keeps its verdict when its adjusted p is below α, else it reads "not resolved".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.effect import ALPHA, direction_p, holm, mean_se, welch_se
from looplab.report.pages import markdown_table, register_block
from looplab.studies.mechanistic.trained import (
    HALVED,
    LAYERS_FILE,
    RUNS_FILE,
    STUDY,
    _read,
    decision_lines,
    stage_table,
)
from looplab.studies.prose import holm_cell, holm_summary, p_cell, verdict_of

UNRESOLVED = "not resolved"


@dataclass(frozen=True)
class Decision:
    """One decision: the rule's line and verdict, its p-value, and Holm's adjusted p."""

    line: str
    verdict: str
    p: float
    holm_p: float = float("nan")

    @property
    def question(self) -> str:
        return self.line.split(":")[0]

    @property
    def holm_verdict(self) -> str:
        if self.verdict.startswith("n/a"):
            return self.verdict
        return self.verdict if self.holm_p < ALPHA else UNRESOLVED


def samples(layers: pd.DataFrame, runs: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray | None, float, bool]]:
    """(sample, second sample or None, line, holds above the line) of each decision, in the rules' order: what
    :func:`looplab.studies.mechanistic.trained.decision_lines` reads."""
    base, zeroed = stage_table(layers), stage_table(layers, "zero_massive")
    looped = base.loc[base.arm == "looped", "alignment"].dropna().to_numpy(dtype=float)
    paired = base.merge(zeroed, on=["arm", "seed"], suffixes=("", "_zeroed"))
    pairs = paired[paired.arm == "looped"]
    ratio = (pairs.amplitude_zeroed.astype(float) / pairs.amplitude.astype(float)).dropna().to_numpy()
    done = runs[runs.status == "done"]

    def clean(values) -> np.ndarray:
        return np.asarray(pd.Series(values, dtype=float).dropna())

    amplitude = [clean(base.loc[base.arm == arm, "amplitude"]) for arm in ("looped", "looped-sandwich")]
    delta = [
        clean(np.log10(done.loc[done.arm == arm, "delta_128"].astype(float))) for arm in ("looped-noinject", "looped")
    ]
    return [(looped, None, 0.0, True), (ratio, None, HALVED, False), (*amplitude, 0.0, True), (*delta, 0.0, True)]


def _verdict(p: float, estimate: float, line: float, holds_above: bool) -> str:
    if p >= ALPHA:
        return UNRESOLVED
    return "holds" if (estimate > line) == holds_above else "fails"


def decisions(results_dir: Path) -> list[Decision]:
    """The four decisions with p-values and Holm-adjusted p; raises when the p-values decide unlike the rule."""
    layers, runs = _read(results_dir, LAYERS_FILE), _read(results_dir, RUNS_FILE)
    found = []
    for line, (a, b, threshold, holds_above) in zip(decision_lines(layers, runs), samples(layers, runs)):
        rule = verdict_of(line)
        if rule.startswith("n/a"):
            found.append(Decision(line, rule, float("nan")))
            continue
        estimate, se, dof = mean_se(a) if b is None else welch_se(a, b)
        p = direction_p(estimate, se, dof, threshold)
        verdict = _verdict(p, estimate, threshold, holds_above)
        if verdict != rule:
            raise ValueError(f"{line}: the p-values give {verdict!r}, the rule {rule!r}")
        found.append(Decision(line, rule, p))
    adjusted, _ = holm([d.p for d in found])
    return [Decision(d.line, d.verdict, d.p, float(q)) for d, q in zip(found, adjusted)]


@register_block(f"{STUDY}/holm")
def holm_block(results_dir: Path) -> str:
    """The four decisions: p unadjusted and after Holm, both verdicts."""
    found = decisions(results_dir)
    body = [
        [
            d.question,
            f"{p_cell(d.p)} → {p_cell(d.holm_p)}",
            d.verdict,
            holm_cell(d.verdict, d.holm_verdict),
        ]
        for d in found
    ]
    summary = holm_summary(
        len(found),
        sum(d.verdict != UNRESOLVED for d in found),
        sum(d.holm_verdict != UNRESOLVED for d in found),
        [f"{d.question}: {d.verdict} → {d.holm_verdict}" for d in found if d.holm_verdict != d.verdict],
        head="The verdicts Holm changes: ",
    )
    return markdown_table(["decision", "p → Holm", "verdict (rule)", "verdict (Holm)"], body) + "\n\n" + summary
