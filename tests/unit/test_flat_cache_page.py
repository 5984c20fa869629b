"""The flat-cache study's rule on made-up reads: free, not free and not resolved, and n/a without seeds."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from looplab.studies.flat_cache import page
from looplab.studies.flat_cache import protocol as P


def _reads(em_gaps: list[float], loss_gaps: list[float], seeds=P.SEEDS, arm="lognormal") -> pd.DataFrame:
    """Reads whose gaps at every loop count are ``em_gaps`` / ``loss_gaps`` (one per seed)."""
    rows = []
    for seed, em, loss in zip(seeds, em_gaps, loss_gaps):
        for loops in P.READ_LOOPS:
            base = {"arm": arm, "seed": seed, "loops": loops, "mean_depth": loops, "cache_mib": 1.0}
            rows.append({**base, "cache": "per_loop", "exact_match": 60.0, "loss": 2.0})
            rows.append({**base, "cache": "shared", "exact_match": 60.0 - em, "loss": 2.0 + loss})
            rows.append({**base, "cache": "last_m", "exact_match": 60.0, "loss": 2.0})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "em, loss, expected",
    [
        ([0.0, 0.1, -0.1], [0.0, 0.001, -0.001], page.FREE),
        ([10.0, 11.0, 12.0], [0.0, 0.0, 0.0], page.NOT_FREE),
        ([0.0, 0.0, 0.0], [0.2, 0.21, 0.22], page.NOT_FREE),
        ([0.0, 3.0, -2.0], [0.0, 0.0, 0.0], page.OPEN),  # the interval straddles the margin
    ],
)
def test_the_rule_reads_the_student_t_bounds(em, loss, expected):
    word, _ = page.verdict(page.gaps(_reads(em, loss), "shared"))
    assert word == expected


def test_fewer_seeds_than_planned_is_not_resolved_and_an_empty_arm_is_na():
    reads = _reads([0.0, 0.0], [0.0, 0.0], seeds=P.SEEDS[:2])
    word, why = page.verdict(page.gaps(reads, "shared"))
    assert word == page.OPEN and "2 of 3 seeds" in why[0]
    text = page.render(reads, page.READS)
    assert "n/a (0 seeds)" in text  # the arms with no reads
    assert "**lognormal**: `shared` is **not resolved**" in text


def test_the_committed_page_is_what_its_reads_give():
    """docs/results/flat-cache.md is the page writer's output on the committed reads (nothing edited by hand)."""
    from looplab.studies.flat_cache.page import PAGE, READS, render

    root = Path(__file__).resolve().parents[2]
    assert (root / PAGE).read_text(encoding="utf-8") == render(pd.read_csv(root / READS), READS)
