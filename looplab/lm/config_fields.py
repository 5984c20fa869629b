"""One declaration of the ``config.json`` fields a family reads, each with its type and domain, checked when a
model dir is opened — before any layer is built — so that a string where a number belongs, a zero or a
negative where a positive belongs, or a value that makes every forward NaN is refused in one line naming
the field and the file, never met later as a TypeError inside a layer or a NaN model that exits 0.

A family declares ``{field: rule}`` with the rules below; :func:`check_fields` checks every declared field
the config holds (a field it lacks keeps the family's default, which the declaration does not judge).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from looplab.errors import LooplabError

__all__ = [
    "Rule",
    "boolean",
    "check_fields",
    "integer",
    "one_of",
    "positive_number",
    "token_ids",
    "unit_interval",
]

#: a rule: the value → None when it is valid, else what the field must be (completing "FIELD must be …")
Rule = Callable[[Any], "str | None"]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int = 1, high: int | None = None, optional: bool = False) -> Rule:
    """An integer in ``low``..``high`` (null too when ``optional``: the family's own default)."""
    span = f"≥ {low}" if high is None else f"in {low}..{high}"
    need = f"an integer {span}" + (" or null" if optional else "")

    def rule(value):
        if value is None and optional:
            return None
        ok = _is_int(value) and value >= low and (high is None or value <= high)
        return None if ok else need

    return rule


def positive_number() -> Rule:
    """A finite number > 0 (a zero or negative ε or θ makes the forward NaN or infinite)."""

    def rule(value):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and math.isfinite(value) and value > 0 else "a finite number > 0"

    return rule


def unit_interval() -> Rule:
    """A number in (0, 1]."""

    def rule(value):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and 0 < value <= 1 else "a number in (0, 1]"

    return rule


def boolean() -> Rule:
    def rule(value):
        return None if isinstance(value, bool) else "true or false"

    return rule


def one_of(*choices) -> Rule:
    """One of ``choices`` (the values the published model uses, where looplab implements no other)."""

    def rule(value):
        return None if value in choices else f"one of {', '.join(map(repr, choices))}"

    return rule


def token_ids() -> Rule:
    """A token id ≥ 0, a list of them, or null."""

    def rule(value):
        ids = value if isinstance(value, list) else [value]
        ok = value is None or (ids and all(_is_int(i) and i >= 0 for i in ids))
        return None if ok else "a token id ≥ 0, a list of them, or null"

    return rule


def check_fields(config: dict, declaration: dict[str, Rule], where: str) -> None:
    """Refuse the first declared field of ``config`` (the raw JSON object) outside its rule, in one line:
    ``WHERE: FIELD must be …, got VALUE``."""
    for name, rule in declaration.items():
        if name in config:
            need = rule(config[name])
            if need is not None:
                raise LooplabError(f"{where}: {name} must be {need}, got {config[name]!r}")
