"""Reading configs: TOML files or bundled presets, ``section.key=value`` overrides, typed filling."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, get_origin, get_type_hints

from looplab.config.checks import validate
from looplab.config.schema import LEGACY_EXIT_KEYS, PRESETS, Config, EvalConfig, GenerateConfig, ScheduleConfig
from looplab.errors import LooplabError, choice_error
from looplab.params import check_type
from looplab.plugins import load_plugins, normalise_plugins


def _fill(target: Any, values: dict[str, Any], where: str) -> None:
    """Set the fields of dataclass ``target`` from ``values``, recursing into sub-tables.

    The tables whose keys belong to components (``[schedule]``'s parameters, each
    ``[stability.NAME]``, ``[eval.exits.NAME]`` and ``[generate.exits.NAME]``) are kept as they
    are, for ``check_config`` to check against the component's own declaration.
    """
    hints = get_type_hints(type(target))
    if isinstance(target, EvalConfig):
        values = _with_exit_tables(values)
    for key, value in values.items():
        name = f"{where}.{key}" if where else key
        if key not in hints:
            raise choice_error(f"key in [{where}]" if where else "config section", key, hints)
        if dataclasses.is_dataclass(hints[key]) or get_origin(hints[key]) is dict:
            if not isinstance(value, dict):
                raise LooplabError(f"config section [{name}] must be a table, got {value!r}")
        if isinstance(target, Config) and key == "schedule":
            target.schedule = ScheduleConfig(**{"name": target.schedule.name, **value})
            check_type("schedule.name", target.schedule.name, str)
        elif isinstance(target, (EvalConfig, GenerateConfig)) and key == "exits":
            for name, table in value.items():
                if not isinstance(table, dict):
                    raise LooplabError(f"config section [{where}.exits.{name}] must be a table, got {table!r}")
                target.exits[name] = {**target.exits.get(name, {}), **table}
        elif isinstance(target, Config) and key == "stability":
            for regulariser, table in value.items():
                if not isinstance(table, dict):
                    raise LooplabError(f"config section [stability.{regulariser}] must be a table, got {table!r}")
                target.stability[regulariser] = {**target.stability.get(regulariser, {}), **table}
        elif dataclasses.is_dataclass(hints[key]):
            _fill(getattr(target, key), value, name)
        else:
            setattr(target, key, check_type(name, value, hints[key]))


def _with_exit_tables(section: dict[str, Any]) -> dict[str, Any]:
    """``[eval]`` with the keys of earlier releases (``fixed_exit``, ``convergence_eps``) moved into the
    exit tables they now belong to, so old configs and run dirs read unchanged."""
    legacy = {key: section[key] for key in LEGACY_EXIT_KEYS if key in section}
    exits = section.get("exits", {})
    if not legacy or not isinstance(exits, dict):
        return section  # nothing to move, or a malformed [eval.exits] that _fill reports
    exits = {name: dict(table) if isinstance(table, dict) else table for name, table in exits.items()}
    for key, value in legacy.items():
        name, field = LEGACY_EXIT_KEYS[key]
        table = exits.setdefault(name, {})
        if isinstance(table, dict) and field in table:
            raise LooplabError(f"eval.{key} is the earlier name of eval.exits.{name}.{field}: set one of them")
        if isinstance(table, dict):
            table[field] = value
    return {**{key: value for key, value in section.items() if key not in legacy}, "exits": exits}


def from_dict(data: dict[str, Any]) -> Config:
    """Build a validated :class:`Config` from nested ``{section: {key: value}}``, importing its
    ``run.plugins`` before checking it."""
    config = Config()
    _fill(config, data, "")
    config.run.plugins = normalise_plugins(config.run.plugins)
    for table, key in ((config.task, "pool"), (config.task, "text_file"), (config.model, "pretrained"),
                       (config.model, "pretrained_tokenizer")):  # fmt: skip
        if getattr(table, key):  # paths made absolute, so a run dir's config.toml finds them from anywhere
            setattr(table, key, str(Path(getattr(table, key)).expanduser().resolve()))
    load_plugins(config.run.plugins)
    validate(config)
    return config


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """Parse ``section.key=value`` (or ``section.sub.key=value``).

    Returns:
        the key path and the value, read as TOML or else as a bare string.
    """
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise LooplabError(f"override {text!r} must look like section.key=value")
    dotted, raw = text.split("=", 1)
    path = tuple(part.strip() for part in dotted.split("."))
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def resolve_preset(path: str | Path) -> Path:
    """``path`` itself when it exists, else the bundled preset of that name, with or without ``.toml``
    (``demo``, ``stopping-small/binary_addition-fixed``, ``sweeps/stars-small``); else ``path`` unchanged."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    preset = PRESETS / (path if path.suffix == ".toml" else path.with_name(path.name + ".toml"))
    return preset if preset.is_file() else path


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The tables of the TOML file at ``path`` (or of the bundled preset of that name); a missing or
    malformed file is a one-line error naming ``what``."""
    path = resolve_preset(path)
    if path.is_dir():
        raise LooplabError(f"{what} {path} is a directory, not a TOML file")
    if not path.is_file():
        folders = sorted(p.name for p in PRESETS.iterdir() if p.is_dir())
        raise LooplabError(
            f"{what} not found: {path} (neither a file nor a bundled preset; presets: demo, "
            f"{', '.join(f'{folder}/…' for folder in folders)})"
        )
    try:
        text = path.read_text(encoding="utf-8")
        if text.startswith("\ufeff"):  # a byte-order mark (some Windows editors write one): TOML has none
            raise LooplabError(f"{what} {path} starts with a UTF-8 byte-order mark; save it as UTF-8 without BOM")
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise LooplabError(f"{what} {path} is not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise LooplabError(f"{what} {path} is not UTF-8 text") from None


def config_source(path: str | Path | None, overrides: list[str] = ()) -> str:
    """Where a config's values come from, as an error names it: the file (resolved to its preset) and/or
    the ``--set`` overrides."""
    sets = "--set " + ", ".join(overrides) if overrides else ""
    if path is None:
        return sets or "the defaults"
    return f"config file {resolve_preset(path)}" + (f" with {sets}" if sets else "")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a TOML config (or start from defaults when ``path`` is None), then apply overrides; an error in
    a value names where it came from (:func:`config_source`)."""
    data: dict[str, Any] = {} if path is None else read_toml(path, "config file")
    if path is not None and not data and not overrides:  # an emptied file, not a choice of every default
        raise LooplabError(
            f"config file {resolve_preset(path)} holds no settings; write at least one table, e.g. [task], "
            "or give --set"
        )
    for text in overrides:
        keys, value = parse_override(text)
        table = data
        for depth, key in enumerate(keys[:-1]):
            table = table.setdefault(key, {})
            if not isinstance(table, dict):
                raise LooplabError(f"config section [{'.'.join(keys[: depth + 1])}] must be a table")
        table[keys[-1]] = value
    try:
        return from_dict(data)
    except LooplabError as err:
        raise LooplabError(f"{config_source(path, overrides)}: {err}") from None
