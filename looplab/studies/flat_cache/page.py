"""The flat-memory cache study's page from its committed reads (:mod:`looplab.studies.flat_cache.protocol`).

    python -m looplab.studies.flat_cache.page [--reads docs/results/flat-cache/reads.csv]
                                             [--out docs/results/flat-cache.md]

Every number on the page comes from the per-seed reads; every verdict from the protocol's rule. A metric
with no seeds behind it is n/a with its count.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import t_interval
from looplab.report.effect import welch_interval
from looplab.studies.flat_cache import protocol as P

READS = Path("docs/results/flat-cache/reads.csv")
PAGE = Path("docs/results/flat-cache.md")
FREE, NOT_FREE, OPEN = "free", "not free", "not resolved"


def gaps(reads: pd.DataFrame, flat: str) -> pd.DataFrame:
    """Per (arm, seed, loops): em_gap (points) and loss_gap (nats per byte) of cache ``flat`` against
    ``per_loop``."""
    keys = ["arm", "seed", "loops"]
    exact = reads[reads.cache == "per_loop"].set_index(keys)
    other = reads[reads.cache == flat].set_index(keys)
    frame = pd.DataFrame({"em_gap": exact.exact_match - other.exact_match, "loss_gap": other.loss - exact.loss})
    return frame.dropna().reset_index()


def interval(values) -> tuple[float, float, float, int]:
    """(mean, low, high, n) with the 95 % Student-t interval; NaN where fewer than two values."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return math.nan, math.nan, math.nan, 0
    low, high = t_interval(values) if len(values) >= 2 else (math.nan, math.nan)
    return float(values.mean()), float(low), float(high), len(values)


def verdict(frame: pd.DataFrame, protocol=P) -> tuple[str, list[str]]:
    """The protocol's rule on one arm's gaps (all read loop counts), and the reason in words; ``protocol`` is
    this study's or one that takes its rule (READ_LOOPS, SEEDS, EM_MARGIN, LOSS_MARGIN)."""
    reasons, every_within = [], True
    seeds = len(protocol.SEEDS)
    for loops in protocol.READ_LOOPS:
        at = frame[frame.loops == loops]
        em, loss = interval(at.em_gap), interval(at.loss_gap)
        if em[3] < seeds or loss[3] < seeds:
            return OPEN, [f"{em[3]} of {seeds} seeds read at {loops} loops"]
        if em[1] > protocol.EM_MARGIN or loss[1] > protocol.LOSS_MARGIN:
            what = "exact-match gap" if em[1] > protocol.EM_MARGIN else "loss gap"
            return NOT_FREE, [f"at {loops} loops the {what}'s lower bound exceeds its margin"]
        if em[2] > protocol.EM_MARGIN or loss[2] > protocol.LOSS_MARGIN:
            every_within = False
            reasons.append(f"at {loops} loops an upper bound exceeds its margin")
    return (FREE, ["every upper bound within its margin"]) if every_within else (OPEN, reasons)


def cell(mean: float, low: float, high: float, n: int, digits: int) -> str:
    if n == 0:
        return "n/a (0 seeds)"
    if math.isnan(low):
        return f"{mean:+.{digits}f} (n = {n}, no interval)"
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def gap_table(reads: pd.DataFrame, flat: str, protocol=P) -> tuple[list[str], dict[str, str]]:
    """The markdown table of one flat cache's gaps by arm and loops, and each arm's verdict (``protocol``'s
    arms and rule)."""
    frame = gaps(reads, flat)
    lines = [
        f"| arm | loops | EM gap, points (per_loop − {flat}) | loss gap, nats/byte ({flat} − per_loop) | seeds |",
        "|---|---|---|---|---|",
    ]
    verdicts = {}
    for arm in protocol.ARMS:
        mine = frame[frame.arm == arm]
        for loops in protocol.READ_LOOPS:
            at = mine[mine.loops == loops]
            em, loss = interval(at.em_gap), interval(at.loss_gap)
            lines.append(f"| {arm} | {loops} | {cell(*em, 1)} | {cell(*loss, 3)} | {em[3]} |")
        verdicts[arm] = verdict(mine, protocol)
    return lines, verdicts


def levels_table(reads: pd.DataFrame) -> list[str]:
    """Seed means of exact match, loss and cache memory by arm, loops and cache (a description)."""
    means = reads.groupby(["arm", "loops", "cache"], sort=False).agg(
        em=("exact_match", "mean"), loss=("loss", "mean"), mib=("cache_mib", "mean"), n=("seed", "nunique")
    )
    lines = [
        "| arm | loops | cache | exact match % | loss (nats/byte) | KV MiB | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for (arm, loops, cache), row in means.iterrows():
        lines.append(f"| {arm} | {loops} | {cache} | {row.em:.1f} | {row.loss:.3f} | {row.mib:.2f} | {int(row.n)} |")
    return lines


def welch_lines(reads: pd.DataFrame) -> list[str]:
    """Each arm's shared-cache EM gap at 8 loops against fixed4's (Welch's 95 % interval; described)."""
    frame = gaps(reads, "shared")
    at = frame[frame.loops == 8]
    base = at[at.arm == "fixed4"].em_gap.to_numpy()
    lines = []
    for arm in P.ARMS:
        if arm == "fixed4":
            continue
        mine = at[at.arm == arm].em_gap.to_numpy()
        if len(mine) < 2 or len(base) < 2:
            lines.append(f"- {arm} − fixed4: n/a ({len(mine)} and {len(base)} seeds)")
            continue
        low, high = welch_interval(mine, base)
        lines.append(
            f"- {arm} − fixed4: {mine.mean() - base.mean():+.1f} points, Welch 95 % [{low:+.1f}, {high:+.1f}] "
            f"({len(mine)} vs {len(base)} seeds)"
        )
    return lines


def seeds_line(reads: pd.DataFrame, protocol=P) -> str:
    """How many seeds each of ``protocol``'s arms has read, of those planned."""
    seeds = reads.groupby("arm").seed.nunique().to_dict()
    counts = ", ".join(f"{arm} {seeds.get(arm, 0)}" for arm in protocol.ARMS)
    return f"Few seeds: {counts} (of {len(protocol.SEEDS)} planned)."


def rule_sections(reads: pd.DataFrame, protocol=P) -> list[str]:
    """The decided part of a page under ``protocol``'s rule: each arm's verdict on ``shared``, the ``shared`` and
    ``last_m`` gap tables, and ``last_m``'s verdicts (this study's, or one that takes its rule)."""
    shared, shared_verdicts = gap_table(reads, "shared", protocol)
    last_m, last_m_verdicts = gap_table(reads, "last_m", protocol)
    free = [arm for arm, (word, _) in shared_verdicts.items() if word == FREE]
    lines = []
    for arm in protocol.ARMS:
        word, why = shared_verdicts[arm]
        lines.append(f"- **{arm}**: `shared` is **{word}** ({'; '.join(why)}).")
    return [
        *lines,
        "",
        (
            f"An arm whose `shared` cache is free by the rule: {', '.join(free)}."
            if free
            else "No arm's `shared` cache is free by the rule."
        ),
        "",
        f"## `shared` against `per_loop` (mean over seeds, 95 % Student-t; margins {protocol.EM_MARGIN:g} "
        f"point{'' if protocol.EM_MARGIN == 1 else 's'} and {protocol.LOSS_MARGIN:g} nats)",
        "",
        *shared,
        "",
        f"## `last_m` (m = {protocol.KEEP_LOOPS}) against `per_loop`",
        "",
        *last_m,
        "",
        "By the same rule: " + "; ".join(f"{arm} {word}" for arm, (word, _) in last_m_verdicts.items()) + ".",
    ]


def render(reads: pd.DataFrame, source: Path) -> str:
    lines = [
        "# Which training makes the flat-memory cache free?",
        "",
        f"Protocol: `looplab/studies/flat_cache/protocol.py`, frozen before the first run. Reads: `{source}`",
        "(one row per arm, seed, loops and cache); this page: `python -m looplab.studies.flat_cache.page`.",
        "Its runs recorded no start time or code (they predate per-run provenance, and their run dirs are gone): "
        "`looplab results --check` holds this study by git dates alone (its reads first committed after the "
        "protocol).",
        seeds_line(reads),
        "",
        "## Verdicts (the protocol's rule)",
        "",
        *rule_sections(reads),
        "",
        "## Between arms (described, not a decision)",
        "",
        "`shared`-cache EM gap at 8 loops, each arm against fixed4:",
        "",
        *welch_lines(reads),
        "",
        "## Levels (seed means; a description)",
        "",
        *levels_table(reads),
        "",
        "The `shared` cache's memory is one key and value per core layer and token whatever the depth; "
        "`last_m` holds m of them; `per_loop` one per loop (the KV MiB column).",
        "",
        "Not among the arms: training with the shared cache's own view of earlier tokens (at every loop, "
        "each earlier token's keys and values from its last loop), which needs two unrolls per step. The "
        "trainer had none when this protocol was frozen; it has it now (`train.shared_view_weight`), and "
        "its arms are studied in [flat-cache-view.md](flat-cache-view.md) and, with 20 seeds per arm, "
        "equivalence tests and Holm, in the confirmation study ([flat-cache-confirm.md](flat-cache-confirm.md)).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=Path, default=READS)
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args()
    reads = pd.read_csv(args.reads)
    args.out.write_text(render(reads, args.reads), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
