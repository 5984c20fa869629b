"""``looplab results`` on faulty committed files: each fault is one line naming the file (and row), exit 2,
and a collect from sweeps that are not the study's leaves the committed CSVs as they were."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import TINY, run_cli

PAGES = Path(__file__).resolve().parents[2] / "docs" / "results"
RUNS = "stopping-confirm/runs.csv"


def _bad_cell(path: Path) -> None:
    frame = pd.read_csv(path, dtype=str)
    frame.loc[3, "oracle_ood"] = "abc"
    frame.to_csv(path, index=False)


def _missing_column(path: Path) -> None:
    pd.read_csv(path).drop(columns=["policy_ood"]).to_csv(path, index=False)


def _cut_mid_line(path: Path) -> None:
    text = path.read_bytes()
    path.write_bytes(text[: text.index(b"\n", 4000) - 7])


FAULTS = [
    ("bad cell", _bad_cell, f"{RUNS}: line 5, column 'oracle_ood': 'abc' is not a number"),
    ("empty file", lambda p: p.write_text(""), f"{RUNS}: the file is empty"),
    ("cut off mid-line", _cut_mid_line, f"{RUNS}: the file ends mid-line"),
    (
        "missing column",
        _missing_column,
        "block stopping-confirm/arms-15: a column it reads is missing from the CSVs under stopping-confirm/: "
        "'policy_ood'",
    ),
]


@pytest.fixture
def pages(tmp_path: Path) -> Path:
    """A copy of the committed results pages and their CSVs."""
    return Path(shutil.copytree(PAGES, tmp_path / "results"))


@pytest.mark.parametrize("name, damage, message", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_faulty_csv_is_named_in_one_line(pages, name, damage, message):
    damage(pages / RUNS)
    result = run_cli("results", "--dir", str(pages), "--check")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_a_page_that_is_not_utf8_is_named_in_one_line(pages):
    page = next(p for p in sorted(pages.glob("*.md")) if "<!-- generated:" in p.read_text(encoding="utf-8"))
    page.write_bytes(page.read_bytes() + b"\xff\xfe a stray Latin-1 byte\n")
    result = run_cli("results", "--dir", str(pages), "--check")
    assert result.returncode == 2, result.stderr
    assert f"results page {page} is not UTF-8 text" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_missing_frozen_protocol_fails_the_check(pages):
    (pages / "stopping-confirm" / "PROTOCOL.md").unlink()
    result = run_cli("results", "--dir", str(pages), "--check")
    assert result.returncode == 1
    assert "stopping-confirm: its frozen protocol stopping-confirm/PROTOCOL.md is missing" in result.stderr


def test_the_committed_pages_pass_the_check(pages):
    result = run_cli("results", "--dir", str(pages), "--check")
    assert result.returncode == 0, result.stderr


def test_a_collect_from_another_studys_sweep_changes_nothing(pages, tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "demo.toml").write_text(TINY.format(steps=4, checkpoint_every=4))
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text('[sweep]\nconfigs = ["configs/demo.toml"]\nseeds = 1\n')
    swept = run_cli("sweep", str(sweep_file), "--out", str(tmp_path / "sweep"), "--no-progress")
    assert swept.returncode == 0, swept.stderr
    before = {p: p.read_bytes() for p in (pages / "recursive-small").rglob("*") if p.is_file()}

    result = run_cli("results", "--dir", str(pages), "--collect", str(tmp_path / "sweep"), "--study", "recursive-small")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "do not give study recursive-small's results" in line and "nothing under" in line
    after = {p: p.read_bytes() for p in (pages / "recursive-small").rglob("*") if p.is_file()}
    assert after == before
    assert not list(pages.rglob(".tmp_*"))
