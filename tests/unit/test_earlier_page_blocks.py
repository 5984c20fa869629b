"""The tables that were hand copies on the earlier pages are generated blocks: each gives the committed text
from its CSVs, a hand edit of one of its cells is reported by ``looplab results --check``, and a change in a
CSV shows in the table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from looplab.report.comparison import PAPER_TABLES_DIR
from looplab.report.pages import BLOCKS, regenerate
from looplab.studies import load_studies
from looplab.studies.earlier_paper import paper_config

load_studies()

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
STOPPING = "stopping-small-binary_addition"

NEW_BLOCKS = [
    (f"{STOPPING}.md", f"{STOPPING}/vs-paper-main", STOPPING),
    (f"{STOPPING}.md", f"{STOPPING}/vs-paper-ablation", STOPPING),
    (f"{STOPPING}.md", f"{STOPPING}/vs-paper-cost", STOPPING),
    ("mechanistic-small.md", "mechanistic-small/seeds", "mechanistic-small"),
    ("mechanistic.md", "mechanistic-trained/pilot", "mechanistic-trained/sink-pilot"),
]


def committed_block(page: str, block: str) -> str:
    """The body of ``block`` as the committed page holds it."""
    text = (RESULTS / page).read_text(encoding="utf-8")
    start = text.index(f"<!-- generated: {block} -->\n") + len(f"<!-- generated: {block} -->\n")
    return text[start : text.index("<!-- end generated -->", start)]


def rows(table: str) -> list[list[str]]:
    """The body rows of a Markdown table, as lists of stripped cells."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]


def copy_of(folder: str, into: Path) -> Path:
    shutil.copytree(RESULTS / folder, into / folder)
    return into


@pytest.mark.parametrize("page, block, folder", NEW_BLOCKS, ids=[b for _, b, _ in NEW_BLOCKS])
def test_a_hand_edited_cell_is_reported_and_rewritten_from_the_csvs(tmp_path, page, block, folder):
    body = committed_block(page, block)
    last = body.rstrip("\n").splitlines()[-1].split("|")
    last[3] = " 99 "  # the third cell of the last row
    edited = "\n".join(body.rstrip("\n").splitlines()[:-1] + ["|".join(last)]) + "\n"
    assert edited != body
    copy_of(folder, tmp_path)
    stale = tmp_path / "page.md"
    stale.write_text(f"intro\n<!-- generated: {block} -->\n{edited}<!-- end generated -->\n", encoding="utf-8")

    assert regenerate(tmp_path, check=True) == [stale]
    regenerate(tmp_path)
    assert stale.read_text(encoding="utf-8") == f"intro\n<!-- generated: {block} -->\n{body}<!-- end generated -->\n"


#: our stopping-small variants (named by their schedule) → the paper's config, and its main-table schedule
PAPER_ROWS = {
    "fixed": ("fixed_K20", "fixed_K20"),
    "matched": ("matched_K_n", "matched_K_n"),
    "rl_halting": ("rl_halting_ent0.001", "rl_halting"),
    "window": ("window_n_pm5_single_depth", "window_n_pm5"),
}


@pytest.mark.parametrize(
    "variant, config",
    [*((v, c) for v, (c, _) in PAPER_ROWS.items()), ("fixed_window", "fixed_window_K20_pm5"), ("demo", None)],
)
def test_a_variant_is_read_as_its_schedule(variant, config):
    assert paper_config(variant) == config


def test_the_stopping_tables_are_the_cells_beside_the_paper_rows():
    cells = pd.read_csv(RESULTS / STOPPING / "cells.csv").set_index("variant")
    main = pd.read_csv(PAPER_TABLES_DIR / "stopping_main.csv", dtype=str)
    ablation = pd.read_csv(PAPER_TABLES_DIR / "stopping_ablation_binary_addition.csv", dtype=str)
    cost = pd.read_csv(PAPER_TABLES_DIR / "stopping_cost.csv", dtype=str)

    shown = rows(BLOCKS[f"{STOPPING}/vs-paper-main"](RESULTS))
    assert [r[1] for r in shown] == list(PAPER_ROWS)
    for task, variant, seeds, paper_row, ours_ood, paper_ood, _, _, ours_std, paper_std, ours_gap, _ in shown:
        row = cells.loc[variant]
        printed = main[(main.task == task) & (main.schedule == PAPER_ROWS[variant][1])].iloc[0]
        assert paper_row == f"binary_addition / {PAPER_ROWS[variant][1]}"
        assert seeds == str(int(row["Oracle OOD (%).n"]))
        assert ours_ood == f"{row['Oracle OOD (%).mean']:.1f} ± {row['Oracle OOD (%).std']:.1f}"
        assert ours_std == f"{row['Oracle OOD (%).std']:.1f}" and ours_gap.startswith(f"{row['Gap (pp).mean']:.1f} ±")
        assert (paper_ood, paper_std) == (printed.oracle_ood_pct, printed.std_pp)

    shown = rows(BLOCKS[f"{STOPPING}/vs-paper-ablation"](RESULTS))
    assert [r[1] for r in shown] == ["fixed", "rl_halting", "window"]  # matched_K_n is no ablation config
    for row in shown:
        printed = ablation[ablation.config == PAPER_ROWS[row[1]][0]].iloc[0]
        assert row[3] == printed.config and row[5] == printed.oracle_ood_pct and row[-1] == printed.note

    shown = rows(BLOCKS[f"{STOPPING}/vs-paper-cost"](RESULTS))
    assert [(r[1], r[-1]) for r in shown] == [
        (v, cost[cost.schedule == PAPER_ROWS[v][1]].block_evals_per_step.iloc[0])
        for v in ("matched", "rl_halting", "window")
    ]  # the paper gives no cost for fixed_K20


def test_a_changed_aggregate_shows_in_the_stopping_tables(tmp_path):
    copy_of(STOPPING, tmp_path)
    path = tmp_path / STOPPING / "cells.csv"
    cells = pd.read_csv(path)
    cells.loc[cells.variant == "fixed", "Oracle OOD (%).mean"] = 12.34
    cells.to_csv(path, index=False)
    for block in ("vs-paper-main", "vs-paper-ablation"):
        (fixed,) = [r for r in rows(BLOCKS[f"{STOPPING}/{block}"](tmp_path)) if r[1] == "fixed"]
        assert fixed[4] == "12.3 ± 1.0"


def test_the_seeds_table_counts_a_diverged_run(tmp_path):
    copy_of("mechanistic-small", tmp_path)
    path = tmp_path / "mechanistic-small" / "cells.csv"
    cells = pd.read_csv(path)
    cells.loc[0, "diverged"] = 1
    cells.to_csv(path, index=False)
    shown = rows(BLOCKS["mechanistic-small/seeds"](tmp_path))
    assert shown[0] == ["kjv", cells.variant[0], "7", "1"]
    assert all(r[2:] == ["6", "0"] for r in shown[1:])


def test_the_pilot_table_is_the_checkpoints_at_its_steps(tmp_path):
    checkpoints = pd.read_csv(RESULTS / "mechanistic-trained" / "sink-pilot" / "checkpoints.csv")
    shown = rows(BLOCKS["mechanistic-trained/pilot"](RESULTS))
    assert [r[1] for r in shown] == ["500", "1500", "3000"] * 2
    assert [r[0] for r in shown] == ["feed-forward (2, 16⊗1, 2)", "", "", "looped (2, 4⊗4, 2), injection", "", ""]
    expected = checkpoints[checkpoints.step.isin([500, 1500, 3000])]
    for row, (_, want) in zip(shown, expected.iterrows()):
        assert row[2:4] == [f"{want.train_loss:.3f}", f"{want.sink_max:.3f}"]
        assert row[4].startswith(f"{want.largest_mlp_max:.1f} (") and row[5] == f"{want.top_activation:.1f}"

    copy_of("mechanistic-trained/sink-pilot", tmp_path)
    path = tmp_path / "mechanistic-trained" / "sink-pilot" / "checkpoints.csv"
    changed = checkpoints.copy()
    changed.loc[changed.step == 3000, "largest_mlp"] = "core3"
    changed.to_csv(path, index=False)
    assert {r[4] for r in rows(BLOCKS["mechanistic-trained/pilot"](tmp_path)) if r[1] == "3000"} == {
        "7.7 (core 3)",
        "13.1 (core 3)",
    }


@pytest.mark.parametrize(
    "changes, head, shown",
    [
        ([], "", "4 decisions: 2 resolved by the rule, 1 after Holm. Holm changes no verdict."),
        (["a: holds → not resolved"], "Holm changes 1: ", "4 decisions: 2 resolved by the rule, 1 after Holm. "
         "Holm changes 1: a: holds → not resolved."),
        (["a: x → y", "b: x → y"], "The verdicts Holm changes: ", "4 decisions: 2 resolved by the rule, 1 after "
         "Holm. The verdicts Holm changes: a: x → y; b: x → y."),
    ],
)  # fmt: skip
def test_the_holm_summary_line(changes, head, shown):
    from looplab.studies.prose import holm_cell, holm_summary

    assert holm_summary(4, 2, 1, changes, head=head) == shown
    assert (holm_cell("holds", "holds"), holm_cell("holds", "not resolved")) == ("holds", "**not resolved**")
