"""Verdict prose for the results pages: a frozen rule's decision line said as a sentence, so that the
prose of a page says what its rule says and no more.

A study's decision line reads ``question: evidence (n vs m seeds): verdict`` (the shape of
:func:`looplab.report.effect.comparison_line` and of the studies' own rule lines); an undefined one
``question: what vs what: n/a (why)``. :func:`said` turns it into

    **Question: verdict.** evidence.

with nothing added and nothing left out; a page's "what the data say" blocks are built from such
sentences and from plain descriptions of the committed rows (seed means, ranges, counts), and the
hand-written prose beside them is marked as interpretation.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def split_decision(line: str) -> tuple[str, str, str]:
    """(question, evidence, verdict) of a decision line; the evidence is empty for an undefined one."""
    question, _, rest = line.partition(": ")
    if ": n/a" in f": {rest}":  # "question: a vs b: n/a (why)" or "question: n/a (why)"
        what, _, why = rest.rpartition("n/a")
        return question, what.removesuffix(": "), f"n/a{why}"
    evidence, _, verdict = rest.rpartition("): ")
    return question, f"{evidence})", verdict


def said(line: str) -> str:
    """A decision line as a sentence: the question and its verdict in bold, then the evidence."""
    question, evidence, verdict = split_decision(line)
    head = f"**{question[:1].upper()}{question[1:]}: {verdict}.**"
    return f"{head} {evidence}." if evidence else head


def verdict_of(line: str) -> str:
    """The verdict a decision line ends with."""
    return split_decision(line)[2]


def span(values: Iterable[float], digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
    """The range of ``values`` as "lo–hi" (one value when they agree to the digits shown)."""
    values = scale * np.asarray(list(values), dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return "n/a"
    low, high = f"{values.min():.{digits}f}", f"{values.max():.{digits}f}"
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


def names(items: Iterable[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    items = list(items)
    if len(items) < 2:
        return "".join(items) or "none"
    return f"{', '.join(items[:-1])} and {items[-1]}"


def p_cell(value: float) -> str:
    """A p-value as a table shows it: three decimals, "< 0.001" below that, "n/a" when undefined."""
    return "n/a" if not np.isfinite(value) else f"{value:.3f}" if value >= 0.001 else "< 0.001"


def holm_cell(verdict: str, holm_verdict: str) -> str:
    """Holm's verdict as a Holm table shows it: in bold where it differs from the rule's."""
    return f"**{holm_verdict}**" if holm_verdict != verdict else holm_verdict


def holm_summary(
    m: int, by_rule: int, by_holm: int, changes: list[str], resolved: str = "resolved", head: str = ""
) -> str:
    """The line under a Holm table: how many of its ``m`` decisions the rule and Holm resolve, then the
    ``changes`` Holm makes (one phrase each, after ``head``), or "Holm changes no verdict." when none."""
    counts = f"{m} decisions: {by_rule} {resolved} by the rule, {by_holm} after Holm. "
    return counts + (head + "; ".join(changes) + "." if changes else "Holm changes no verdict.")
