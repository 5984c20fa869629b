"""A run directory on disk: its saved config and its JSONL log.

RUN_DIR/config.toml        the resolved config (every key, defaults written out)
RUN_DIR/log.jsonl          one JSON record per logged training step
RUN_DIR/checkpoints/       step_<N>/ with safetensors weights and a JSON state (``looplab.checkpoint``)
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from looplab.checkpoint import latest_checkpoint
from looplab.config import Config, from_dict
from looplab.errors import LooplabError
from looplab.io import atomic_write

CONFIG_FILE = "config.toml"
LOG_FILE = "log.jsonl"


def load_run_config(run_dir: str | Path) -> Config:
    """The resolved config saved in a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise LooplabError(f"run dir not found: {run_dir}")
    if not path.is_file():
        raise LooplabError(f"{run_dir} is not a run dir (no {CONFIG_FILE})")
    try:
        return from_dict(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as err:
        raise LooplabError(f"{path} is not valid TOML: {err}") from None


def read_log(run_dir: str | Path) -> list[dict]:
    """The records of a run's JSONL log, skipping a torn last line left by a kill mid-write."""
    path = Path(run_dir) / LOG_FILE
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def prepare_run_dir(run_dir: Path, config: Config) -> None:
    """Create the run dir, or check that an existing one holds this same config.

    A run dir whose config was written but that holds no checkpoint yet (a start that
    failed before its first step was saved) takes the new config: nothing trained is lost.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    if path.exists() and latest_checkpoint(run_dir) is not None:
        saved = load_run_config(run_dir).to_dict()
        wanted = config.to_dict()
        diff = [f"{s}.{k}" for s in wanted for k in wanted[s] if saved[s][k] != wanted[s][k]]
        if diff:
            raise LooplabError(
                f"run dir {run_dir} holds a different config (differs in {', '.join(diff[:5])}); use a new --out"
            )
        return
    atomic_write(path, lambda tmp: tmp.write_text(config.to_toml()))
