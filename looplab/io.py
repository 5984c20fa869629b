"""Small helpers shared by the writers of run directories: atomic writes, exclusive locks, and the
flattening of nested records into one-level rows."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from looplab.errors import LooplabError


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary sibling of ``path``, then rename it into place.

    A kill at any moment leaves either the old file or the complete new one.
    """
    tmp = path.with_name(f".tmp_{path.name}")
    try:
        write(tmp)
    except BaseException:  # a full disk or a kill mid-write: no half file stays behind
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


STAGING = ".staging"


@contextmanager
def staged(directory: Path) -> Iterator[Path]:
    """Write a set of files into ``directory`` all or nothing: the block writes them into a fresh
    ``directory/.staging``, then each is renamed into place (a rename needs no space and cannot half
    happen). When the block fails (a full disk, a crash in a plot) the staging folder is removed and
    ``directory``'s files are as they were."""
    stage = directory / STAGING
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        yield stage
        for path in sorted(stage.iterdir()):
            os.replace(path, directory / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


LOCK_FILE = ".lock"


@contextmanager
def exclusive_lock(directory: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (its ``.lock`` file, holding this pid) for the block.

    The lock is an ``flock``, so the kernel drops it when the holder dies, even by SIGKILL:
    a stale ``.lock`` file never blocks anyone. A second holder gets a one-line
    :class:`LooplabError` naming the first one's pid.
    """
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise LooplabError(f"{what} {directory} is in use by process {holder}; wait for it or stop it") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys; lists become JSON strings so every cell is a scalar."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def read_utf8_text(path: str | Path, what: str) -> str:
    """The text of a UTF-8 file; one-line errors, naming it as ``what`` (``--text``, ``task.text_file``), for a
    missing file, a directory, or bytes that are not UTF-8."""
    path = Path(path)
    if path.is_dir():
        raise LooplabError(f"{what} {path} is a directory, not a text file")
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise LooplabError(f"{what} not found: {path}") from None
    except UnicodeDecodeError as err:
        raise LooplabError(f"{what} {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise LooplabError(f"cannot read {what} {path}: {err.strerror or err}") from None


def read_json_object(path: str | Path, what: str, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON object in a UTF-8 file, holding ``keys``; one-line errors naming it as ``what`` (``run
    summary``) for what :func:`read_utf8_text` refuses, a file that is not JSON, JSON that is not an object,
    and an object without one of ``keys``."""
    text = read_utf8_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise LooplabError(f"{what} {path} is not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise LooplabError(f"{what} {path} is not a JSON object of fields (it holds a {type(data).__name__})")
    missing = [key for key in keys if key not in data]
    if missing:
        raise LooplabError(f"{what} {path} lacks the field(s) {', '.join(missing)}")
    return data
