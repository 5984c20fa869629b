"""A run directory on disk: its saved config and its JSONL log.

RUN_DIR/config.toml        the resolved config (every key, defaults written out)
RUN_DIR/log.jsonl          one JSON record per logged training step
RUN_DIR/checkpoints/       step_<N>/ with safetensors weights and a JSON state (``looplab.checkpoint``)
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

from looplab.checkpoint import latest_checkpoint
from looplab.config import Config, from_dict
from looplab.errors import LooplabError
from looplab.io import atomic_write
from looplab.provenance import record_start

CONFIG_FILE = "config.toml"
LOG_FILE = "log.jsonl"
#: a sweep dir holds the sweep file it runs and one run dir per point under ``runs/``
SWEEP_FILE = "sweep.toml"
RUNS_DIR = "runs"


def is_sweep_dir(path: Path) -> bool:
    """Whether ``path`` is a sweep dir (its sweep file and its ``runs/`` folder)."""
    return (path / SWEEP_FILE).is_file() and (path / RUNS_DIR).is_dir()


def load_run_config(run_dir: str | Path) -> Config:
    """The resolved config saved in a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if Path(run_dir).is_file():
        raise LooplabError(f"{run_dir} is a file, not a run dir")
    if not Path(run_dir).is_dir():
        raise LooplabError(f"run dir not found: {run_dir}")
    if not path.is_file():
        raise LooplabError(f"{run_dir} is not a run dir (no {CONFIG_FILE})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise LooplabError(f"{path} is not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise LooplabError(f"{path} is not UTF-8 text") from None
    except OSError as err:
        raise LooplabError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        config = from_dict(data)
    except LooplabError as err:  # a value the run's config may not hold: say which file holds it
        raise LooplabError(f"{path}: {err}") from None
    missing = [section for section in ("task", "model") if section not in data]
    if missing:  # a run writes every table: an emptied or cut file would otherwise load as the defaults
        raise LooplabError(f"{path} has no [{missing[0]}] table: not a config a run was trained with")
    return config


def read_log(run_dir: str | Path) -> list[dict]:
    """The records of a run's JSONL log: JSON objects with an integer ``step``.

    The log is informational (checkpoints hold the state), so a line that is not such a
    record — torn by a kill mid-write, edited, or garbage — is skipped rather than stopping
    ``train`` or ``eval``.
    """
    path = Path(run_dir) / LOG_FILE
    try:
        text = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
    except OSError as err:
        raise LooplabError(f"cannot read {path}: {err.strerror or err}") from None
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            records.append(record)
    return records


def check_run_dir_target(run_dir: Path) -> None:
    """Refuse an ``--out`` that is not a run dir nor a place for one: a file, a sweep dir, or a
    folder holding other files. Checked before anything (even the lock file) is written."""
    if run_dir.exists() and not run_dir.is_dir():
        raise LooplabError(f"--out {run_dir} is a file, not a run dir")
    if not run_dir.is_dir() or (run_dir / CONFIG_FILE).is_file():
        return
    if is_sweep_dir(run_dir):
        raise LooplabError(f"--out {run_dir} is a sweep dir (it holds {SWEEP_FILE}); a run needs a dir of its own")
    others = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))
    if others:
        raise LooplabError(
            f"--out {run_dir} holds other files ({', '.join(others[:3])}{', …' if len(others) > 3 else ''}) "
            "and is not a run dir; use a new or empty dir"
        )


def prepare_run_dir(run_dir: Path, config: Config, complete: Callable[[dict], dict] = lambda saved: saved) -> None:
    """Create the run dir, or check that an existing one holds this same config.

    A run dir whose config was written but that holds no checkpoint yet (a start that
    failed before its first step was saved) takes the new config: nothing trained is lost.
    ``complete`` fills what an older saved config could not hold (sections as a dict) before
    the two are compared.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    if path.exists() and latest_checkpoint(run_dir) is not None:
        saved = complete(load_run_config(run_dir).to_dict())
        wanted = config.to_dict()
        # only the keys the new config states: a config.toml written before a section's keys became the
        # chosen component's own may hold more (e.g. every schedule's keys), which the run never read
        diff = [f"{s}.{k}" for s in wanted for k in wanted[s] if saved.get(s, {}).get(k, ...) != wanted[s][k]]
        if diff:
            raise LooplabError(
                f"run dir {run_dir} holds a different config (differs in {', '.join(diff[:5])}); use a new --out"
            )
        return
    atomic_write(path, lambda tmp: tmp.write_text(config.to_toml()))
    record_start(run_dir, config.to_toml())
