"""A trained run dir records when it first started, which code ran and under which config; a resume keeps it."""

from __future__ import annotations

import hashlib
import json

import pytest

from looplab.errors import LooplabError
from looplab.provenance import PROVENANCE_FILE, git, read_provenance
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


@pytest.mark.parametrize("text", ["[]", "{ cut", ""])
def test_a_damaged_provenance_record_is_named_not_taken_for_none(tmp_path, text):
    (tmp_path / PROVENANCE_FILE).write_text(text)
    with pytest.raises(LooplabError) as refused:
        read_provenance(tmp_path)
    assert str(tmp_path / PROVENANCE_FILE) in str(refused.value)
    assert read_provenance(tmp_path / "elsewhere") == {}  # a run that recorded none
