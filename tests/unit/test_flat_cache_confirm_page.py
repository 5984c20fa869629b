"""The flat-cache confirmation page's statistics on made-up reads: the TOST p is the larger of scipy's two
one-sided t tests, Holm runs across all 20 decisions, and an arm's verdict follows its six tests."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from looplab.studies.flat_cache_confirm import page
from looplab.studies.flat_cache_confirm import protocol as P


def _reads(spread: dict[str, float], seeds=P.SEEDS) -> pd.DataFrame:
    """Per-seed reads whose exact-match gap is centred on 0 with the arm's ``spread`` (points)."""
    rng = np.random.default_rng(0)
    rows = []
    for arm, sd in spread.items():
        for seed in seeds:
            for loops in P.READ_LOOPS:
                gap, loss_gap = rng.normal(0, sd), rng.normal(0.005, 0.004)
                rows.append(dict(arm=arm, seed=seed, loops=loops, cache="per_loop", exact_match=90.0, loss=1.0))
                rows.append(dict(arm=arm, seed=seed, loops=loops, cache="shared", exact_match=90.0 - gap,
                                 loss=1.0 + loss_gap))  # fmt: skip
    return pd.DataFrame(rows)


def test_the_tost_p_is_the_larger_of_the_two_one_sided_t_tests():
    values = np.array([0.1, -0.4, 0.3, 0.0, 0.2, -0.1, 0.5, -0.2])
    lower = stats.ttest_1samp(values, -1.0, alternative="greater").pvalue
    upper = stats.ttest_1samp(values, 1.0, alternative="less").pvalue
    assert page.tost_p(values, 1.0) == pytest.approx(max(lower, upper), rel=1e-12)


def test_a_tight_arm_is_equivalent_a_spread_one_is_not_and_holm_sees_all_twenty():
    gaps = page.flat_page.gaps(_reads({"contractive_view": 0.3, "contractive": 6.0, "lognormal_view": 0.3}), "shared")
    found = page.tests(gaps)
    assert len(found) == 20 and all(np.isfinite(t.p) for t in found)
    lines = page.verdicts(gaps)
    assert "**contractive_view**: `shared` is equivalent" in lines[0]
    assert "**contractive**: `shared` is not shown equivalent" in lines[1]
    table = "\n".join(page.decisions_table(gaps))
    assert table.count("| rejected |") + table.count("| not rejected |") == 20


def test_decisions_wait_for_every_seed():
    gaps = page.flat_page.gaps(_reads({"contractive_view": 0.3}, seeds=P.SEEDS[:5]), "shared")
    assert page.verdicts(gaps)[0] == "- **contractive_view**: pending (5 of 20 seeds read)."
    assert all(not np.isfinite(t.p) for t in page.tests(gaps))


def test_the_committed_page_is_what_its_reads_give(tmp_path):
    """docs/results/flat-cache-confirm.md is the page writer's output on the CSVs committed beside it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = page.write(root / page.DIR, tmp_path / "page.md")
    assert (root / page.PAGE).read_text(encoding="utf-8") == text


def test_the_table_names_its_tests_and_writes_tiny_ps_as_a_bound():
    gaps = page.flat_page.gaps(_reads({"contractive_view": 0.3, "contractive": 6.0, "lognormal_view": 0.3}), "shared")
    lines = page.decisions_table(gaps)
    said = lines[0]
    assert "two one-sided Student-t tests (TOST)" in said and "±1 point" in said and "±0.05 nats/byte" in said
    assert '"rejected" rejects it' in said and "Holm's correction runs across the 20 decisions" in said
    assert lines.index("| decision | seeds | p | Holm p | decided |") > 0  # the statement stands above the table
    assert page.p_text(3e-9) == "< 1e-4" and page.p_text(0.00012) == "0.0001" and page.p_text(0.5) == "0.5000"
    assert "0.0000" not in "\n".join(lines)


def test_seeds_past_a_margin_are_counted_on_both_sides():
    values = pd.Series([-2.0, -1.5, 0.0, 0.5, 1.2])
    assert page._past(values, 1.0) == "2 / 1 of 5"
