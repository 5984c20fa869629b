"""A trained run dir records when it first started, which code ran and under which config; a resume keeps it."""

from __future__ import annotations

import hashlib
import json

from looplab.provenance import PROVENANCE_FILE, git
from tests.conftest import run_cli, train_tiny_run


def test_a_run_records_its_start_code_and_config_and_a_resume_keeps_them(tmp_path):
    config, run_dir = train_tiny_run(tmp_path, 4, 2)
    first = json.loads((run_dir / PROVENANCE_FILE).read_text())
    assert first["config_sha256"] == hashlib.sha256((run_dir / "config.toml").read_bytes()).hexdigest()
    assert first["commit"] == git("rev-parse", "HEAD")  # the checkout the tests run from
    assert first["started_utc"].endswith("Z")
    resumed = run_cli("train", str(config), "--out", str(run_dir), "--no-progress")  # from its last checkpoint
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / PROVENANCE_FILE).read_text()) == first
