"""Plugins: modules that register schedules, regularisers, exits, metrics or tasks from outside looplab.

Two ways in, both imported before a config is checked, in every process that
reads the config (``train``, ``eval``, ``analyze``, and each sweep worker):

- a config's ``[run] plugins`` list: module names (``my_pkg.my_schedule``,
  importable from the working directory or an installed package) or paths to
  ``.py`` files (made absolute when the config is read, so a run dir's
  config.toml finds them again from anywhere);
- the ``looplab.plugins`` entry-point group of installed packages
  (``[project.entry-points."looplab.plugins"] my_thing = "my_pkg.my_thing"``).

A plugin module registers its entries with the family's decorator, exactly as
the built-in ones do (``looplab/examples/plugins`` has one of each).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from looplab.errors import LooplabError

__all__ = [
    "ENTRY_POINT_GROUP",
    "load_plugins",
    "import_plugin",
    "normalise_plugins",
    "register_entry",
    "check_complete",
    "run_entry",
]

ENTRY_POINT_GROUP = "looplab.plugins"
_imported: dict[str, ModuleType] = {}
_entry_points_loaded = False


def normalise_plugins(names: list[str]) -> list[str]:
    """``names`` with every ``.py`` path made absolute (module names unchanged)."""
    return [str(Path(name).expanduser().resolve()) if name.endswith(".py") else name for name in names]


def load_plugins(names: list[str] = ()) -> None:
    """Import the installed entry-point plugins (once per process), then each of ``names``."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _guarded(entry.value, entry.load)
    for name in names:
        import_plugin(name)


def import_plugin(name: str) -> ModuleType:
    """Import one plugin (a module name or a ``.py`` path) once per process; one-line errors."""
    if name not in _imported:
        _imported[name] = _guarded(name, lambda: _import_file(name) if name.endswith(".py") else _import_module(name))
    return _imported[name]


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not (name == err.name or name.startswith(err.name + ".")):
            raise  # the plugin itself imports something missing: reported with its place below
        raise LooplabError(
            f"plugin module {name!r} not found: run.plugins takes importable module names "
            "(installed, or under the working directory) or paths to .py files"
        ) from None


def _import_file(name: str) -> ModuleType:
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise LooplabError(f"plugin file not found: {name} (run.plugins takes module names or paths to .py files)")
    try:
        path.read_bytes().decode("utf-8")  # as configs and prompt files are; Python would skip bad bytes in comments
    except UnicodeDecodeError as err:
        raise LooplabError(f"plugin file {path} is not UTF-8 text (byte {err.start})") from None
    module_name = f"looplab_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _guarded(name: str, load):
    """``load()``, with anything but a :class:`LooplabError` turned into one line naming the plugin and the place:
    an exception, and a ``sys.exit()`` too (it would end the command silently, with its code, mid-way)."""
    try:
        return load()
    except LooplabError:
        raise
    except SystemExit as err:
        where = traceback.extract_tb(err.__traceback__)[-1]
        raise LooplabError(
            f"plugin {name} called sys.exit({err.code!r}) on import ({where.filename}:{where.lineno}); "
            "a plugin module only defines and registers its entries"
        ) from None
    except Exception as err:
        where = traceback.extract_tb(err.__traceback__)[-1]
        raise LooplabError(
            f"plugin {name} failed to import: {type(err).__name__}: {err} ({where.filename}:{where.lineno})"
        ) from None


def check_complete(entry, name: str, family: str) -> None:
    """A ValueError naming the methods of its family's contract that the class ``entry`` leaves abstract."""
    missing = sorted(getattr(entry, "__abstractmethods__", ()))
    if missing:
        raise ValueError(f"{family} {name!r} does not implement {', '.join(missing)}")


def register_entry(registry: dict, name: str, entry, family: str) -> None:
    """Add ``entry`` to a family's ``registry`` under ``name``; a name another entry holds, or a class that
    leaves part of its contract unimplemented, is a ValueError (registering the same entry again, as a
    re-imported module does, is not)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a {family} is registered under a name, a non-empty string; {_origin(entry)} gave {name!r}")
    taken = registry.get(name)
    if taken is not None and _origin(taken) != _origin(entry):
        raise ValueError(f"{family} name {name!r} is taken by {_origin(taken)}")
    check_complete(entry, name, family)
    registry[name] = entry


def run_entry(family: str, name: str, entry, call, *args):
    """``call(*args)``: a registered entry's code, whose own exception (anything but a
    :class:`~looplab.errors.LooplabError`) becomes one line naming the family, the entry and where it is defined."""
    from looplab.errors import one_line

    try:
        return call(*args)
    except LooplabError:
        raise
    except Exception as err:
        raise LooplabError(
            f"{family} {name!r} ({_origin(entry)}) failed: {type(err).__name__}: {one_line(err)}"
        ) from None


def _origin(entry) -> str:
    """Where an entry is defined: its own ``origin``, else its module and qualified name."""
    return getattr(entry, "origin", None) or f"{entry.__module__}.{entry.__qualname__}"
