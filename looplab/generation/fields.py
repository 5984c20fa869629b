"""One parser for how a request decodes: ``looplab generate``'s flags, a server request's body and lm-eval's
``model_args`` are all flat fields, checked here into a :class:`~looplab.generation.options.DecodeOptions`.

The fields: ``loops`` (the fixed depth, or an adaptive exit's cap; default: the model's), ``exit`` (default
``fixed``), ``cache`` (default ``per_loop``; ``none``: no cache), ``decoder`` (default ``step``), and every
parameter the chosen exit, cache policy and decoder declare, each a field of its own (``eps``,
``keep_loops``, ``max_batch``, a plugin's). Values are typed by their declarations; numbers must be finite.
Every refusal is a :class:`FieldError` naming its field, one line, the same from all three ways in (the
server answers it with HTTP 400).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, get_type_hints

from looplab.errors import LooplabError, choice_error
from looplab.generation.decoders import DECODERS, decoder_params
from looplab.generation.options import DecodeOptions, chosen
from looplab.generation.policies import NO_CACHE, POLICIES, cache_params
from looplab.generation.sampling import Sampling
from looplab.token_exits import EXITS, token_exit_params

__all__ = ["FieldError", "CHOICE_FIELDS", "check_fields", "unknown_fields", "decode_options"]

#: the fields that choose: each chosen entry's own parameters are fields too
CHOICE_FIELDS = ("loops", "exit", "cache", "decoder")


class FieldError(LooplabError):
    """A field a request may not have: ``field`` names it, ``reason`` says why; the message is ``field: reason``."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _choices(fields: Mapping[str, Any]) -> tuple[str, str, str]:
    """The exit, cache and decoder ``fields`` choose, each checked against its registry."""
    picked = []
    for field, registry, default in (("exit", EXITS, "fixed"), ("cache", (*POLICIES, NO_CACHE), None),
                                     ("decoder", DECODERS, "step")):  # fmt: skip
        value = fields.get(field)
        if value is None:
            picked.append(default)
            continue
        if not isinstance(value, str):
            raise FieldError(field, f"must be a name (a string), got {value!r}")
        if value not in registry:
            kind = {"exit": "generation exit", "cache": "KV cache policy", "decoder": "decoder"}[field]
            raise FieldError(field, str(choice_error(kind, value, registry)))
        picked.append(value)
    exit_name, cache, decoder = picked
    return exit_name, *chosen(cache, decoder)


def _owners(exit_name: str, cache: str, decoder: str) -> dict[str, tuple[str, str]]:
    """Each parameter field of the chosen entries → (the kind that declares it, ``exit``, ``cache`` or
    ``decoder``; its entry's name)."""
    declared = [
        ("exit", exit_name, EXITS[exit_name].params),
        *([("cache", cache, POLICIES[cache].Params)] if cache in POLICIES else []),
        ("decoder", decoder, DECODERS[decoder].Params),
    ]
    owners: dict[str, tuple[str, str]] = {}
    for kind, name, params in declared:
        for key in get_type_hints(params):
            if key in CHOICE_FIELDS or key in owners:
                other_kind, other_name = owners.get(key, ("", ""))
                other = "a field that chooses" if key in CHOICE_FIELDS else f"the {other_name} {other_kind}"
                raise FieldError(key, f"declared by the {name} {kind} and by {other}: a field can mean one thing")
            owners[key] = (kind, name)
    return owners


def _other_owners(key: str) -> str | None:
    """The entries that declare ``key`` ("the kl and latent-diff exits"), or None."""
    found = []
    for kind, entries in (("exit", {n: e.params for n, e in EXITS.items()}),
                          ("cache", {n: e.Params for n, e in POLICIES.items()}),
                          ("decoder", {n: e.Params for n, e in DECODERS.items()})):  # fmt: skip
        names = [name for name, params in entries.items() if key in get_type_hints(params)]
        if names:
            listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
            found.append(f"the {listed} {kind}{'s' if len(names) > 1 else ''}")
    return " and of ".join(found) or None


def check_fields(fields: Mapping[str, Any], unknown_ok: bool = False) -> tuple[str, str, str, dict[str, dict]]:
    """The exit, cache and decoder ``fields`` choose, and their parameters by owner (``exit``, ``cache``,
    ``decoder``), each field checked against the declarations; no model needed (so a CLI refuses a bad
    line before reading weights). A field nobody chose declares is refused unless ``unknown_ok`` (the
    caller then checks its own fields)."""
    exit_name, cache, decoder = _choices(fields)
    owners = _owners(exit_name, cache, decoder)
    params: dict[str, dict] = {"exit": {}, "cache": {}, "decoder": {}}
    for key, value in fields.items():
        if key in CHOICE_FIELDS or value is None:
            continue
        if key not in owners:
            others = _other_owners(key)
            if others is not None:
                chose = f"exit {exit_name}, cache {cache}, decoder {decoder}"
                raise FieldError(key, f"a parameter of {others}; this request chooses {chose}")
            if unknown_ok:
                continue
            raise FieldError(key, f"unknown field; valid fields: {', '.join((*CHOICE_FIELDS, *owners))}")
        if isinstance(value, float) and not math.isfinite(value):
            raise FieldError(key, f"must be a finite number, got {value}")
        params[owners[key][0]][key] = value
    checks = (
        ("exit", lambda values: token_exit_params(exit_name, {}, **values)),
        ("cache", lambda values: cache_params(cache, values) if cache in POLICIES else None),
        ("decoder", lambda values: decoder_params(decoder, values)),
    )
    for kind, check in checks:
        try:
            check(params[kind])
        except LooplabError as err:
            named = [key for key in params[kind] if f".{key} " in str(err)]
            raise FieldError(named[0] if named else kind, str(err)) from None
    return exit_name, cache, decoder, params


def unknown_fields(fields: Mapping[str, Any]) -> tuple[list[str], tuple[str, ...]]:
    """``fields`` checked as :func:`check_fields` checks them, letting through the fields no entry declares
    (a caller's own, or a mistake it names beside its own fields): those fields, sorted, and every decode
    field a request with these choices may hold (:data:`CHOICE_FIELDS` and the chosen exit's, cache's and
    decoder's parameters)."""
    exit_name, cache, decoder, _ = check_fields(fields, unknown_ok=True)
    valid = (*CHOICE_FIELDS, *_owners(exit_name, cache, decoder))
    return sorted(set(fields) - set(valid)), valid


def decode_options(fields: Mapping[str, Any], lm, sampling: Sampling, unknown_ok: bool = False) -> DecodeOptions:
    """The :class:`DecodeOptions` of ``fields`` for the text LM ``lm`` (a
    :class:`~looplab.generation.text_lm.TextLM`: its default loops and cap, its run's
    ``[generate.exits.NAME]`` tables, its halting head), sampling with ``sampling``; :class:`FieldError`."""
    exit_name, cache, decoder, params = check_fields(fields, unknown_ok)
    loops = fields.get("loops")
    if loops is not None and (isinstance(loops, bool) or not isinstance(loops, int) or not 1 <= loops <= lm.loop_cap):
        raise FieldError("loops", f"must be an integer in 1..{lm.loop_cap}, got {loops!r}")
    try:
        rule = lm.exit_rule(exit_name, loops, **params["exit"])
    except LooplabError as err:
        raise FieldError("exit", str(err)) from None
    try:
        return DecodeOptions(rule, cache, sampling, decoder, params["cache"], params["decoder"])
    except LooplabError as err:
        raise FieldError("decoder" if fields.get("decoder") is not None else "cache", str(err)) from None
