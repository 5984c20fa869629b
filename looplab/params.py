"""Typed parameters with domains: how every component declares its config keys, and where they are checked.

A component (a config section, a schedule, a regulariser, ...) declares its
parameters as a dataclass whose fields are made with :func:`param`: a default
and a :class:`Domain` (an interval or a set of choices). :func:`fill` builds
one from a TOML table, and :func:`check_domains` checks one built in Python;
both raise the same one-line :class:`~looplab.errors.LooplabError` for an
unknown key, a wrongly typed value or a value outside its domain::

    @dataclass
    class Params:
        depth: int = param(20, at_least(1), "the constant depth c")
        mode: str = param("sampled", one_of("exact", "sampled"))
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin, get_type_hints

from looplab.errors import LooplabError, choice_error

__all__ = [
    "Domain",
    "ANY_REAL",
    "POSITIVE",
    "NON_NEGATIVE",
    "UNIT",
    "FRACTION",
    "OPEN_UNIT",
    "at_least",
    "one_of",
    "param",
    "domain_of",
    "check_domains",
    "check_type",
    "fill",
    "as_dict",
]


@dataclass(frozen=True)
class Domain:
    """The values a parameter may take: finite numbers in an interval, or one of ``choices``."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()

    def contains(self, value: Any) -> bool:
        """Whether ``value`` lies in the domain; NaN and ±inf never lie in an interval."""
        if self.choices:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.choices:
            return ", ".join(str(choice) for choice in self.choices)
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


ANY_REAL = Domain(low_open=True, high_open=True)
POSITIVE = Domain(0.0, math.inf, True, True)
NON_NEGATIVE = Domain(0.0, math.inf, False, True)
UNIT = Domain(0.0, 1.0)
FRACTION = Domain(0.0, 1.0, False, True)
OPEN_UNIT = Domain(0.0, 1.0, True, True)


def at_least(low: float) -> Domain:
    """[low, inf)."""
    return Domain(low, math.inf, False, True)


def one_of(*choices: Any) -> Domain:
    """Exactly one of ``choices``."""
    return Domain(choices=tuple(choices))


def param(default: Any, domain: Domain | None = None, doc: str = "") -> Any:
    """A dataclass field with its default, its domain (None: any value of its type) and a one-line description."""
    metadata = {"domain": domain, "doc": doc}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def domain_of(declared: dataclasses.Field) -> Domain | None:
    """The domain :func:`param` gave a field (None when it has none)."""
    return declared.metadata.get("domain")


def _domain_error(where: str, value: Any, domain: Domain, owner: str, doc: str) -> LooplabError:
    if domain.choices:
        return choice_error(f"value for {where}{owner}:", value, domain.choices)
    return LooplabError(f"{where} must be in {domain}{owner}, got {value!r}" + (f" ({doc})" if doc else ""))


def check_domains(params: Any, prefix: str, owner: str = "") -> None:
    """Raise a one-line error for the first field of dataclass ``params`` outside its domain.

    ``prefix`` names the TOML section ("model", "schedule"); ``owner`` ends the message
    (" for the fixed schedule") where the section's keys belong to a chosen component.
    """
    for declared in dataclasses.fields(params):
        domain, value = domain_of(declared), getattr(params, declared.name)
        if domain is not None and not domain.contains(value):
            raise _domain_error(f"{prefix}.{declared.name}", value, domain, owner, declared.metadata.get("doc", ""))


def check_type(where: str, value: Any, annotation: Any) -> Any:
    """``value`` coerced to ``annotation`` (an int where a float is declared), or a one-line error."""
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        if not isinstance(value, list):
            raise LooplabError(f"{where} must be a list of {item.__name__}, got {value!r}")
        return [check_type(where, v, item) for v in value]
    if annotation is Any:
        return value
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, bool) or not isinstance(value, annotation):
        raise LooplabError(f"{where} must be {annotation.__name__}, got {value!r}")
    return value


def fill(cls: type, values: dict[str, Any], prefix: str, owner: str = "") -> Any:
    """An instance of the parameter dataclass ``cls`` from a TOML table, every key typed and in its domain."""
    hints = get_type_hints(cls)
    for key in values:
        if key not in hints:
            raise choice_error(f"key in [{prefix}]{owner}", key, hints)
    params = cls(**{key: check_type(f"{prefix}.{key}", value, hints[key]) for key, value in values.items()})
    check_domains(params, prefix, owner)
    return params


def entry_params(declared: type, values: Any, prefix: str, label: str) -> Any:
    """The checked parameters ``declared`` of a registered entry (``label``: "the last_m cache") from a dict of
    its keys (the rest at their defaults), or an instance checked as is; one-line errors naming the valid
    keys and domains (``prefix``: where its keys live, ``cache.last_m``)."""
    if isinstance(values, declared):
        check_domains(values, prefix)
        return values
    if values is not None and not isinstance(values, dict):
        raise LooplabError(f"{label}'s params must be a dict or {declared.__name__}, got {type(values).__name__}")
    keys = get_type_hints(declared)
    for key in values or {}:
        if key not in keys:
            raise choice_error(f"parameter of {label}", key, keys or ["(none: it has no parameters)"])
    return fill(declared, values or {}, prefix)


def as_dict(params: Any) -> dict[str, Any]:
    """The fields of a parameter dataclass, in declaration order (lists copied)."""
    return dataclasses.asdict(params)
