"""Pre-registration anyone can verify: did a frozen study's runs start after its protocol was committed,
and did they run the protocol's code?

A study that declares a frozen protocol (:func:`looplab.report.pages.register_frozen`) is checked
against the first commit that added its ``PROTOCOL.md``:

    with provenance.csv   each run's own record (``looplab.provenance``, one row per run, written by
                          ``looplab results --collect``): it started after that commit, and ran that
                          commit's code, or a later commit whose ``looplab/`` is byte-identical to it,
                          from a checkout without uncommitted changes
    without it            the runs predate their records; what git still shows is checked: the study's
                          CSVs were first committed after its protocol, and the line says the runs'
                          own start and code are not recorded

Outside a git checkout (an installed wheel, a copied folder) nothing can be checked, and the line says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from looplab.errors import LooplabError, one_line
from looplab.provenance import PROVENANCE_FILE, git, git_succeeds, read_provenance

PROVENANCE_CSV = "provenance.csv"
COLUMNS = ("run_id", "started_utc", "commit", "dirty", "version", "config_sha256")


def provenance_rows(sweep_dirs: list[Path]) -> pd.DataFrame:
    """One row per run of ``sweep_dirs``: every trained run dir (``SWEEP/runs/<run_id>/``) and every other
    folder that recorded its provenance (a study's own runs, e.g. ``SWEEP/retrofit/<recipe>-seed<s>/``),
    named by its folder. A run dir that recorded none gets its config's SHA-256 from its ``config.toml``
    and empty start and code."""
    runs = set()
    for sweep in map(Path, sweep_dirs):
        runs |= {p for p in (sweep / "runs").glob("*") if (p / "config.toml").is_file()}
        runs |= {p.parent for p in sweep.rglob(PROVENANCE_FILE)}
    rows = []
    for run in sorted(runs):
        facts = read_provenance(run)
        config = facts.get("config_sha256")
        if not config and (run / "config.toml").is_file():
            config = hashlib.sha256((run / "config.toml").read_bytes()).hexdigest()
        rows.append({**{key: facts.get(key) for key in COLUMNS}, "run_id": run.name, "config_sha256": config})
    return pd.DataFrame(rows, columns=list(COLUMNS))


@dataclass(frozen=True)
class Check:
    """One frozen study's pre-registration check: ``holds`` (None: it could not be checked) and its line."""

    study: str
    holds: bool | None
    line: str


def _first_added(path: str, where: Path) -> tuple[str, pd.Timestamp] | None:
    """The oldest commit that added ``path`` (a pathspec under ``where``) and its commit time."""
    found = git("log", "--diff-filter=A", "--format=%H %cI", "--", path, where=where).splitlines()
    if not found:
        return None
    commit, when = found[-1].split(" ", 1)
    return commit, pd.Timestamp(when)


def _same_code(protocol: str, commit: str, where: Path) -> bool:
    """Whether ``commit`` is ``protocol`` or a later commit whose ``looplab/`` tree is the same."""
    if commit == protocol:
        return True
    if not git_succeeds("merge-base", "--is-ancestor", protocol, commit, where=where):
        return False
    tree = git("rev-parse", f"{protocol}:looplab", where=where)
    return bool(tree) and tree == git("rev-parse", f"{commit}:looplab", where=where)


def check_study(results_dir: Path, study: str, protocol: str) -> Check:
    """The pre-registration check of ``study`` (its CSVs under ``results_dir/study``, its protocol at
    ``results_dir/protocol``)."""
    results_dir = Path(results_dir)
    added = _first_added(protocol, results_dir)
    if added is None:
        return Check(study, None, f"{study}: {protocol} is not in a git history here: not checked")
    commit, frozen = added
    head = f"{study}: protocol {commit[:7]} ({frozen:%Y-%m-%d %H:%M} UTC)"
    records = results_dir / study / PROVENANCE_CSV
    if records.is_file():
        try:
            runs = pd.read_csv(records, dtype={"commit": str})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise LooplabError(f"{records}: not a readable CSV ({one_line(err)})") from None
        missing = [column for column in ("started_utc", "commit") if column not in runs.columns]
        if missing:
            raise LooplabError(f"{records} lacks column(s) {', '.join(missing)}; rebuild it with results --collect")
        started = pd.to_datetime(runs["started_utc"], utc=True, errors="coerce")
        unrecorded = int(started.isna().sum())
        early = int((started < frozen).sum())
        code = runs["commit"].fillna("").astype(str)
        same = sum(_same_code(commit, c, results_dir) for c in code if c)
        dirty = int(runs["dirty"].astype(str).str.lower().eq("true").sum())
        holds = unrecorded == 0 and early == 0 and same == len(runs) and dirty == 0
        return Check(
            study,
            holds,
            f"{head}; {len(runs)} runs: {len(runs) - unrecorded - early} started after it, {early} before, "
            f"{unrecorded} unrecorded; {same} ran its code (or a later commit with looplab/ unchanged), "
            f"{dirty} from a checkout with uncommitted changes: {'holds' if holds else 'FAILS'}",
        )
    data = _first_added(f"{study}/*.csv", results_dir)
    if data is None:
        return Check(study, None, f"{head}; no committed CSVs: not checked")
    data_commit, collected = data
    holds = collected > frozen
    return Check(
        study,
        holds,
        f"{head}; runs' start times and code not recorded (collected before runs recorded them); its CSVs "
        f"were first committed in {data_commit[:7]} ({collected:%Y-%m-%d %H:%M} UTC), "
        f"{'after' if holds else 'NOT after'} the protocol",
    )
