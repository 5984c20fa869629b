"""Pre-registration checks: a frozen study's runs against the commit of its protocol, in a throwaway git
history, and the provenance a run dir records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from looplab.provenance import PROVENANCE_FILE, read_provenance, record_start
from looplab.report.preregistration import PROVENANCE_CSV, check_study, provenance_rows


def _git(root: Path, *args: str, when: str = "2026-01-01T10:00:00+00:00") -> str:
    env = {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "HOME": str(root), "PATH": "/usr/bin:/bin"}
    identity = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", *identity, *args], cwd=root, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """A repository whose results/study/PROTOCOL.md is committed at 10:00 beside a looplab/ folder."""
    root = tmp_path / "repo"
    (root / "results" / "study").mkdir(parents=True)
    (root / "looplab").mkdir()
    (root / "looplab" / "code.py").write_text("x = 1\n")
    (root / "results" / "study" / "PROTOCOL.md").write_text("frozen\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "protocol")
    return root


def _records(results: Path, commit: str | list[str], started: list[str], dirty: bool = False) -> None:
    commits = commit if isinstance(commit, list) else [commit] * len(started)
    rows = [
        {"run_id": f"r{i}", "started_utc": s, "commit": c, "dirty": dirty, "version": "0", "config_sha256": "x"}
        for i, (s, c) in enumerate(zip(started, commits))
    ]
    pd.DataFrame(rows).to_csv(results / "study" / PROVENANCE_CSV, index=False)


def test_runs_after_the_protocol_on_its_code_hold(history):
    protocol = _git(history, "rev-parse", "HEAD")
    (history / "notes.txt").write_text("a later commit that leaves looplab/ as it was\n")
    _git(history, "add", ".")
    _git(history, "commit", "-q", "-m", "notes", when="2026-01-01T11:00:00+00:00")
    later = _git(history, "rev-parse", "HEAD")
    _records(history / "results", [protocol, later], ["2026-01-01T10:30:00Z", "2026-01-01T11:30:00Z"])
    check = check_study(history / "results", "study", "study/PROTOCOL.md")
    assert check.holds is True, check.line
    assert "2 started after it, 0 before, 0 unrecorded; 2 ran its code" in check.line


@pytest.mark.parametrize(
    "started, dirty, changed_code, says",
    [
        (["2026-01-01T09:00:00Z"], False, False, "0 started after it, 1 before"),  # run before the freeze
        (["2026-01-01T10:30:00Z"], True, False, "1 from a checkout with uncommitted changes"),
        ([""], False, False, "1 unrecorded"),
        (["2026-01-01T12:00:00Z"], False, True, "0 ran its code"),  # a later commit that changed looplab/
    ],
)
def test_a_run_that_does_not_follow_the_protocol_fails(history, started, dirty, changed_code, says):
    commit = _git(history, "rev-parse", "HEAD")
    if changed_code:
        (history / "looplab" / "code.py").write_text("x = 2\n")
        _git(history, "commit", "-q", "-am", "change", when="2026-01-01T11:00:00+00:00")
        commit = _git(history, "rev-parse", "HEAD")
    _records(history / "results", commit, started, dirty)
    check = check_study(history / "results", "study", "study/PROTOCOL.md")
    assert check.holds is False and says in check.line and check.line.endswith("FAILS"), check.line


def test_rows_collected_before_runs_recorded_provenance_are_checked_by_their_commit(history):
    (history / "results" / "study" / "runs.csv").write_text("arm,seed\na,1\n")
    _git(history, "add", ".")
    _git(history, "commit", "-q", "-m", "data", when="2026-01-01T12:00:00+00:00")
    check = check_study(history / "results", "study", "study/PROTOCOL.md")
    assert check.holds is True and "not recorded" in check.line and "after the protocol" in check.line


def test_outside_a_git_history_nothing_is_claimed(tmp_path):
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "PROTOCOL.md").write_text("frozen\n")
    check = check_study(tmp_path, "study", "study/PROTOCOL.md")
    assert check.holds is None and "not checked" in check.line


def test_a_run_dir_records_its_first_start_and_the_collect_reads_it(tmp_path):
    run = tmp_path / "sweep" / "runs" / "abc"
    run.mkdir(parents=True)
    (run / "config.toml").write_text("[run]\nseed = 1\n")
    record_start(run, "[run]\nseed = 1\n")
    facts = read_provenance(run)
    assert set(facts) == {"started_utc", "version", "commit", "dirty", "config_sha256"}
    assert facts["started_utc"].endswith("Z") and len(facts["config_sha256"]) == 64
    older = tmp_path / "sweep" / "runs" / "old"  # trained before runs recorded provenance
    older.mkdir()
    (older / "config.toml").write_text("[run]\nseed = 2\n")
    rows = provenance_rows([tmp_path / "sweep"]).set_index("run_id")
    assert rows.loc["abc", "started_utc"] == facts["started_utc"]
    assert pd.isna(rows.loc["old", "started_utc"]) and len(rows.loc["old", "config_sha256"]) == 64
    assert json.loads((run / PROVENANCE_FILE).read_text()) == facts


def test_a_collect_writes_the_runs_provenance_beside_the_studys_rows(tmp_path):
    from looplab.report.pages import collect
    from tests.unit.test_results_pages import _fake_run

    run = _fake_run(tmp_path / "sweep", "a", "fixed", 100)
    record_start(run, (run / "config.toml").read_text())
    _fake_run(tmp_path / "sweep", "b", "fixed", 101)  # one trained before runs recorded provenance
    frame = collect("stopping-confirm", [tmp_path / "sweep"], tmp_path / "results")
    rows = pd.read_csv(tmp_path / "results" / "stopping-confirm" / PROVENANCE_CSV).set_index("run_id")
    assert set(rows.index) == set(frame["run_id"]) == {"a", "b"}
    assert rows.loc["a", "started_utc"] == read_provenance(run)["started_utc"] and pd.isna(rows.loc["b", "commit"])
