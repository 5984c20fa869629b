"""Which code ran, and when: the facts a pre-registered study is checked against.

A run dir records, when training first starts, ``provenance.json``:

    started_utc     the first start, ISO 8601 in UTC (a resumed run keeps it)
    commit          the git commit of the looplab source that ran ("" outside a checkout)
    dirty           whether that checkout had uncommitted changes to tracked files
    version         the installed looplab version
    config_sha256   the SHA-256 of the resolved config.toml the run trained under

``looplab results --collect`` copies these into the study's ``provenance.csv`` (one row per run),
and ``looplab results --check`` holds them against the commit of the study's ``PROTOCOL.md``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from looplab.io import atomic_write, read_json_object

PROVENANCE_FILE = "provenance.json"
SOURCE = Path(__file__).resolve().parent


def git(*args: str, where: Path = SOURCE) -> str:
    """The stripped output of ``git -C where ARGS``; "" when git or the checkout is missing, or it fails."""
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def git_succeeds(*args: str, where: Path = SOURCE) -> bool:
    """Whether ``git -C where ARGS`` exits 0 (False when git or the checkout is missing)."""
    try:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def code_version() -> dict[str, object]:
    """The looplab that runs: its version, its checkout's commit ("" outside one) and whether it has
    uncommitted changes to tracked files."""
    try:
        installed = version("looplab")
    except PackageNotFoundError:
        installed = ""
    commit = git("rev-parse", "HEAD")
    dirty = bool(commit) and bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"version": installed, "commit": commit, "dirty": dirty}


def record_start(run_dir: Path, config_toml: str) -> None:
    """Write the run's ``provenance.json``, at the start of a run that has no checkpoint yet (a resume
    keeps the first start's)."""
    facts = {
        "started_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **code_version(),
        "config_sha256": hashlib.sha256(config_toml.encode("utf-8")).hexdigest(),
    }
    text = json.dumps(facts, indent=2) + "\n"
    atomic_write(Path(run_dir) / PROVENANCE_FILE, lambda p: p.write_text(text, encoding="utf-8"))


def read_provenance(run_dir: Path) -> dict[str, object]:
    """A run dir's recorded provenance; empty when it has none (a run trained before it was recorded)."""
    path = Path(run_dir) / PROVENANCE_FILE
    if not path.exists():
        return {}
    return read_json_object(path, "provenance record")
