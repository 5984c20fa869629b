"""The shared-view arms' page on made-up reads: the flat-cache rule on this protocol's arms and seeds, n/a with
counts, and the described comparison with the flat-cache study's arms."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from looplab.studies.flat_cache import page as flat_page
from looplab.studies.flat_cache import protocol as base_protocol
from looplab.studies.flat_cache_view import page
from looplab.studies.flat_cache_view import protocol as P


def _reads(arm: str, seeds, em_gaps, exact_match: float = 60.0) -> pd.DataFrame:
    rows = []
    for seed, em in zip(seeds, em_gaps, strict=True):
        for loops in P.READ_LOOPS:
            base = {"arm": arm, "seed": seed, "loops": loops, "mean_depth": loops, "cache_mib": 1.0}
            rows.append({**base, "cache": "per_loop", "exact_match": exact_match, "loss": 2.0})
            rows.append({**base, "cache": "shared", "exact_match": exact_match - em, "loss": 2.0})
            rows.append({**base, "cache": "last_m", "exact_match": exact_match, "loss": 2.0})
    return pd.DataFrame(rows)


def test_the_rule_is_the_flat_cache_rule_on_this_protocols_arms():
    reads = pd.concat(
        [_reads("lognormal_view", P.SEEDS, [0.0, 0.1, -0.1]), _reads("contractive_view", P.SEEDS[:2], [0.0, 0.0])]
    )
    base = _reads("lognormal", base_protocol.SEEDS, [50.0, 52.0, 54.0], exact_match=70.0)
    text = page.render(reads, page.READS, base, page.BASE)
    assert "**lognormal_view**: `shared` is **free**" in text
    assert "**contractive_view**: `shared` is **not resolved** (2 of 3 seeds read at 4 loops)" in text
    assert "An arm whose `shared` cache is free by the rule: lognormal_view." in text
    # the view arm's gap is 52 points below its base's, and its per_loop exact match 10 points below
    row = next(line for line in text.splitlines() if line.startswith("| lognormal_view − lognormal"))
    assert row.split(" | ")[1].startswith("-52.0 [") and row.split(" | ")[3].startswith("-10.0")
    assert "| contractive_view − contractive | n/a (2 and 0 seeds)" in text
    assert flat_page.verdict(flat_page.gaps(reads[reads.arm == "lognormal_view"], "shared"), P)[0] == flat_page.FREE


def test_the_exploratory_exits_pair_each_seeds_caches():
    rows = []
    for seed, em_flat in zip(P.SEEDS, [98.0, 97.0, 96.0], strict=True):
        for cache, em, loss, depth, mib in (("per_loop", 99.0, 1.80, 3.0, 16.25), ("shared", em_flat, 1.81, 3.5, 1.0)):
            base = {"arm": "contractive_view", "seed": seed, "exit": "kl", "byte_depth": depth}
            rows.append(
                {**base, "cache": cache, "exact_match": em, "loss": loss, "answer_depth": depth, "cache_mib": mib}
            )
    rows.append({**rows[0], "exit": "confidence"})  # a per_loop read without its shared one is left out
    lines = page.exits_section(pd.DataFrame(rows), page.EXITS_CSV)
    assert lines[0].startswith("## Exploratory")
    (row,) = [line for line in lines if line.startswith("| contractive_view")]
    cells = row.split(" | ")
    assert cells[2].startswith("+2.0 [") and cells[3].startswith("+0.010 [")  # gaps 1, 2, 3 points; 0.01 nats
    assert cells[4] == "3.00 / 3.50" and cells[5] == "16.25 / 1.00" and cells[6] == "3 |"


def test_the_committed_page_is_what_its_reads_give():
    """docs/results/flat-cache-view.md is the page writer's output on the committed reads of both studies."""
    root = Path(__file__).resolve().parents[2]
    exits = pd.read_csv(root / page.EXITS_CSV)
    base = pd.read_csv(root / page.BASE)
    text = page.render(pd.read_csv(root / page.READS), page.READS, base, page.BASE, exits)
    assert (root / page.PAGE).read_text(encoding="utf-8") == text
