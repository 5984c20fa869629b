"""The shared-view arms' page from their committed reads (:mod:`looplab.studies.flat_cache_view.protocol`).

    python -m looplab.studies.flat_cache_view.page [--reads docs/results/flat-cache-view/reads.csv]
                                                  [--base docs/results/flat-cache/reads.csv]
                                                  [--exits docs/results/flat-cache-view/exploratory-exits.csv]
                                                  [--out docs/results/flat-cache-view.md]

Every number comes from the per-seed reads; the verdicts from the flat-cache study's rule on this
protocol's arms and seeds; the comparison with the flat-cache study's arms (``--base``) is described, not
decided, and so are the exploratory per-token exits (``--exits``, :mod:`looplab.studies.flat_cache_view.exits`;
left out when that file is absent). A metric with no seeds behind it is n/a with its count.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from looplab.report.effect import welch_interval
from looplab.studies.flat_cache import page as flat_page
from looplab.studies.flat_cache_view import protocol as P
from looplab.studies.flat_cache_view.exits import CAP, EXITS_CSV

READS = Path("docs/results/flat-cache-view/reads.csv")
BASE = flat_page.READS
PAGE = Path("docs/results/flat-cache-view.md")
LOOPS = 8  # the loop count of the described comparisons, as in the flat-cache study


def welch_cell(mine, base, digits: int) -> str:
    """Mean difference with Welch's 95 % interval, or n/a with the counts where either side has < 2 seeds."""
    if len(mine) < 2 or len(base) < 2:
        return f"n/a ({len(mine)} and {len(base)} seeds)"
    low, high = welch_interval(mine, base)
    return f"{mine.mean() - base.mean():+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def against_bases(reads: pd.DataFrame, base: pd.DataFrame) -> list[str]:
    """Each arm against the flat-cache study's arm of the same base at :data:`LOOPS` loops: its shared-cache
    gaps and its ``per_loop`` exact match and loss (differences, Welch's 95 % interval)."""
    lines = [
        "| arm − base | EM gap, points | loss gap, nats/byte | per_loop EM, points | per_loop loss, nats/byte "
        "| seeds |",
        "|---|---|---|---|---|---|",
    ]
    mine_gaps, base_gaps = flat_page.gaps(reads, "shared"), flat_page.gaps(base, "shared")
    for arm, other in P.BASES.items():
        ours = mine_gaps[(mine_gaps.arm == arm) & (mine_gaps.loops == LOOPS)]
        theirs = base_gaps[(base_gaps.arm == other) & (base_gaps.loops == LOOPS)]
        exact = reads[(reads.arm == arm) & (reads.loops == LOOPS) & (reads.cache == "per_loop")]
        exact_base = base[(base.arm == other) & (base.loops == LOOPS) & (base.cache == "per_loop")]
        cells = [
            welch_cell(ours.em_gap.to_numpy(), theirs.em_gap.to_numpy(), 1),
            welch_cell(ours.loss_gap.to_numpy(), theirs.loss_gap.to_numpy(), 3),
            welch_cell(exact.exact_match.to_numpy(), exact_base.exact_match.to_numpy(), 1),
            welch_cell(exact.loss.to_numpy(), exact_base.loss.to_numpy(), 3),
        ]
        lines.append(f"| {arm} − {other} | {' | '.join(cells)} | {len(ours)} vs {len(theirs)} |")
    return lines


def exits_section(exits: pd.DataFrame, source: Path) -> list[str]:
    """The exploratory per-token exits: per arm and exit, ``shared`` against ``per_loop`` (95 % Student-t of the
    paired per-seed gaps) beside each cache's loops per answer token and keys and values held."""
    keys = ["arm", "seed", "exit"]
    exact = exits[exits.cache == "per_loop"].set_index(keys)
    flat = exits[exits.cache == "shared"].set_index(keys)
    paired = pd.DataFrame(
        {
            "em_gap": exact.exact_match - flat.exact_match,
            "loss_gap": flat.loss - exact.loss,
            "depth_exact": exact.answer_depth,
            "depth_flat": flat.answer_depth,
            "mib_exact": exact.cache_mib,
            "mib_flat": flat.cache_mib,
        }
    ).dropna()
    lines = [
        "## Exploratory: per-token exits through the flat cache (chosen after the reads above; no rule)",
        "",
        f"Each run read with an adaptive exit (cap {CAP}) instead of a fixed depth: a token that stopped early is "
        "read at its own last loop by every later token under `shared`. Reads: "
        f"`{source}` (`python -m looplab.studies.flat_cache_view.exits`); the study's problems and passages.",
        "",
        "| arm | exit | EM gap, points (per_loop − shared) | loss gap, nats/byte (shared − per_loop) "
        "| loops per answer token, per_loop / shared | KV MiB, per_loop / shared | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for (arm, name), group in paired.groupby(level=["arm", "exit"], sort=True):
        em, loss = flat_page.interval(group.em_gap), flat_page.interval(group.loss_gap)
        lines.append(
            f"| {arm} | {name} | {flat_page.cell(*em, 1)} | {flat_page.cell(*loss, 3)} "
            f"| {group.depth_exact.mean():.2f} / {group.depth_flat.mean():.2f} "
            f"| {group.mib_exact.mean():.2f} / {group.mib_flat.mean():.2f} | {len(group)} |"
        )
    return lines


def render(
    reads: pd.DataFrame,
    source: Path,
    base: pd.DataFrame,
    base_source: Path,
    exits: pd.DataFrame | None = None,
    exits_source: Path = EXITS_CSV,
) -> str:
    """The page: the verdicts and tables of ``reads``, the comparison with ``base`` (the flat-cache study's
    reads) and, when given, the exploratory ``exits`` reads."""
    lines = [
        "# Does training in the shared cache's view make it free?",
        "",
        f"Protocol: `looplab/studies/flat_cache_view/protocol.py`, frozen before the first run. Reads: `{source}`",
        "(one row per arm, seed, loops and cache; the flat-cache study's reads); this page:",
        "`python -m looplab.studies.flat_cache_view.page`. The flat-cache study's arms, compared below: "
        f"`{base_source}`.",
        flat_page.seeds_line(reads, P),
        "",
        "This study is the pilot of the confirmation study ([flat-cache-confirm.md](flat-cache-confirm.md): "
        "20 seeds per arm, two one-sided tests, Holm across its decisions, the view's contrast at one commit); "
        "its verdicts below are its own frozen rule's, on 3 seeds.",
        "",
        "Training in the view: half the loss is the ordinary unroll's, half a second unroll's in which each core "
        "layer reads every earlier token through the first unroll's last-loop keys and values, and itself through "
        "its own (docs/methods.md §9).",
        "",
        "## Verdicts (the flat-cache study's rule)",
        "",
        *flat_page.rule_sections(reads, P),
        "",
        "## Against the flat-cache study's arms (described, not a decision)",
        "",
        f"At {LOOPS} loops, each arm minus the flat-cache study's arm of the same base (its seeds 7101–7103), "
        "Welch's 95 % interval: the `shared` cache's gaps, and the exact `per_loop` cache's exact match and loss "
        "(what training in the view changes in the exact cache; each interval here that includes 0 does not "
        "decide a change).",
        "",
        *against_bases(reads, base),
        "",
        "## Levels (seed means; a description)",
        "",
        *flat_page.levels_table(reads),
        "",
    ]
    if exits is not None:
        lines += [*exits_section(exits, exits_source), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=Path, default=READS)
    parser.add_argument("--base", type=Path, default=BASE)
    parser.add_argument("--exits", type=Path, default=EXITS_CSV)
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args()
    exits = pd.read_csv(args.exits) if args.exits.is_file() else None
    text = render(pd.read_csv(args.reads), args.reads, pd.read_csv(args.base), args.base, exits, args.exits)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
