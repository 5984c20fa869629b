"""The body of ``POST /v1/completions``, checked: every bad field is a :class:`BadRequest` of one line that
names the field and what it may be (the server answers it with HTTP 400 and goes on serving).

OpenAI's fields (``model``, ``prompt``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``stream``, ``logprobs``, ``echo``, ``n``, ``user``) plus ``top_k`` and looplab's decode fields, read by
the parser ``looplab generate`` and lm-eval use too (:mod:`looplab.generation.fields`): ``loops``,
``exit``, ``cache``, ``decoder`` (``step``, the default, runs beside other requests; any other runs a
request whole, alone: :mod:`looplab.serve.whole_group`) and every parameter the chosen exit, cache and decoder
declare (``eps``, ``threshold``, ``keep_loops``, a plugin's), each a
field of its own.
As in OpenAI's API, ``temperature`` defaults to 1 and ``max_tokens`` to 16. A request
without ``seed`` samples with a fresh one, drawn for it and returned in the response (``looplab.seed``);
numbers must be finite (NaN and infinities are refused).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from looplab.errors import LooplabError
from looplab.generation.checks import check_generation  # the refusals generate() makes
from looplab.generation.fields import FieldError, decode_options, unknown_fields
from looplab.generation.options import DecodeOptions
from looplab.generation.sampling import Sampling
from looplab.generation.text_lm import TextLM
from looplab.generation.views import decodable
from looplab.serve.sampling import Picking
from looplab.serve.whole_group import STEPPED

__all__ = ["BadRequest", "Completion", "parse_completion", "parse_tokenize", "parse_detokenize", "FIELDS"]

#: the most likeliest tokens a ``logprobs`` request may list per token
MAX_TOP_LOGPROBS = 20
#: seeds a request may give: what torch's generators take
MAX_SEED = 2**63 - 1

#: the fields of a completion request beside the decode fields (:func:`looplab.generation.fields.unknown_fields`)
FIELDS = (
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "logprobs",
    "echo", "n", "user",
)  # fmt: skip


class BadRequest(FieldError):
    """A request the server refuses with HTTP 400; ``field`` is the one at fault."""


@dataclass(frozen=True)
class Completion:
    """A checked completion request: ``prompts`` as token ids (one choice each), ``texts`` their text."""

    prompts: list[list[int]]
    texts: list[str]
    max_tokens: int
    picking: Picking
    stops: list[str]
    stream: bool
    logprobs: int | None
    echo: bool
    options: DecodeOptions


def parse_completion(body: Any, lm: TextLM, model_id: str, model) -> Completion:
    """The :class:`Completion` of a decoded JSON ``body``, checked against ``lm`` (``model``: its model as the
    decoder reads it); raises :class:`BadRequest`."""
    if not isinstance(body, dict):
        raise BadRequest("body", f"must be a JSON object of fields, got {type(body).__name__}")
    decoding = {key: value for key, value in body.items() if key not in FIELDS}
    try:
        unknown, valid = unknown_fields(decoding)
    except FieldError as err:
        raise BadRequest(err.field, err.reason) from None
    if unknown:
        raise BadRequest(unknown[0], f"unknown field; valid fields: {', '.join((*FIELDS, *valid))}")
    get = _Fields(body)
    named = get.text("model", model_id)
    if named != model_id:
        raise BadRequest("model", f"unknown model {named!r}; valid choices: {model_id}")
    if get.integer("n", 1, low=1) != 1:
        raise BadRequest("n", "only n = 1 is served (one choice per prompt; send a prompt list for more)")
    prompts, texts = _prompts(body.get("prompt"), lm)
    max_tokens = get.integer("max_tokens", 16, low=0)
    # an unseeded request draws a fresh seed (returned in the response), so N sampled requests are N samples
    seed = get.integer("seed", None, low=0, high=MAX_SEED)
    seed = secrets.randbelow(MAX_SEED + 1) if seed is None else seed
    picking = Picking(
        Sampling(get.number("temperature", 1.0, low=0.0), get.integer("top_k", 0, low=0), seed),
        get.number("top_p", 1.0, low=0.0, open_low=True, high=1.0),
    )
    stops = _stops(body.get("stop"))
    logprobs = get.integer("logprobs", None, low=0, high=MAX_TOP_LOGPROBS)
    try:
        options = decode_options(decoding, lm, picking.sampling)
    except FieldError as err:
        raise BadRequest(err.field, err.reason) from None
    echo = get.boolean("echo", False)
    echo_scored = echo and logprobs is not None
    if options.decoder != STEPPED:
        _check_whole(options.decoder, picking, logprobs)
    for prompt in prompts:
        if len(prompt) > lm.max_context:
            raise BadRequest("prompt", f"{len(prompt)} tokens, longer than the model's context of {lm.max_context}")
        if len(prompt) + max_tokens > lm.max_context:
            raise BadRequest(
                "max_tokens",
                f"{max_tokens} new tokens after a prompt of {len(prompt)} exceed the model's context of "
                f"{lm.max_context}: ask for at most {lm.max_context - len(prompt)}",
            )
    try:
        view = decodable(model, gated=options.exit_rule.needs_gate)  # the gate exit reads a gated view
        check_generation(view, prompts, max(max_tokens, 1), options)
        if echo_scored and options.decoder != STEPPED:  # the echoed prompt is scored by the chosen decoder too
            scored = [p for p in prompts if len(p) > 1]
            if scored:
                check_generation(view, [p[:1] for p in scored], 1, options, forced=[p[1:] for p in scored])
    except LooplabError as err:
        raise BadRequest("request", str(err)) from None
    return Completion(
        prompts, texts, max_tokens, picking, stops, get.boolean("stream", False), logprobs,
        echo, options,
    )  # fmt: skip


def _check_whole(decoder: str, picking: Picking, logprobs: int | None) -> None:
    """What a decoder run whole (not the stepped one) cannot give: ``top_p`` (the engine's own picking) and
    the likeliest tokens at each step (it returns each token's log-probability only)."""
    if picking.top_p < 1 and picking.sampling.temperature > 0:
        raise BadRequest("top_p", f"nucleus sampling is the {STEPPED} decoder's; the {decoder} decoder takes top_p 1")
    if logprobs:
        raise BadRequest(
            "logprobs",
            f"the {decoder} decoder gives each token's log-probability, not the likeliest tokens: "
            f"ask logprobs 0, or decoder {STEPPED}",
        )


class _Fields:
    """Typed reads of a body's fields (a JSON null is the default), each refusing the wrong type."""

    def __init__(self, body: dict):
        self.body = body

    def _value(self, name: str):
        return self.body.get(name)

    def text(self, name: str, default: str | None) -> str | None:
        value = self._value(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise BadRequest(name, f"must be a string, got {_json_type(value)}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self._value(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise BadRequest(name, f"must be true or false, got {_json_type(value)}")
        return value

    def integer(self, name: str, default, low: int | None = None, high: int | None = None):
        value = self._value(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(name, f"must be an integer, got {_json_type(value)}")
        _check_range(name, value, low, high)
        return value

    def number(self, name: str, default, low=None, high=None, open_low: bool = False):
        value = self._value(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest(name, f"must be a number, got {_json_type(value)}")
        if not math.isfinite(value):
            raise BadRequest(name, f"must be a finite number, got {value}")
        _check_range(name, value, low, high, open_low)
        return float(value)


def _check_range(name: str, value, low, high, open_low: bool = False) -> None:
    below = low is not None and (value <= low if open_low else value < low)
    if below or (high is not None and value > high):
        lower = "any" if low is None else f"{'>' if open_low else '≥'} {low}"
        span = f"{lower}" if high is None else f"in {'(' if open_low else '['}{low}, {high}]"
        raise BadRequest(name, f"must be {span}, got {value}")


def _json_type(value) -> str:
    names = {
        bool: "a boolean",
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)


def _prompts(prompt, lm: TextLM) -> tuple[list[list[int]], list[str]]:
    """Token ids and text of each prompt: a string, a list of strings, a list of token ids, or a list of those."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("prompt", "must be a string, a list of strings or a list of token ids (required)")
    ids, texts = [], []
    for item in prompt:
        if isinstance(item, str):
            _check_unicode("prompt", item)
            ids.append(lm.encode(item, prompt=True))
            texts.append(item)
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            bad = [t for t in item if not 0 <= t < lm.vocab_size]
            if bad:
                raise BadRequest("prompt", f"token id {bad[0]} is outside the vocabulary 0..{lm.vocab_size - 1}")
            ids.append(list(item))
            texts.append(lm.decode(list(item)))
        else:
            raise BadRequest("prompt", f"each prompt must be a string or a list of token ids, got {_json_type(item)}")
        if not ids[-1]:
            raise BadRequest("prompt", "a prompt must have at least one token")
    return ids, texts


def _check_unicode(field: str, text: str) -> None:
    """Refuse a text that is not valid Unicode (JSON may carry a lone surrogate, which no encoder takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadRequest(field, f"is not valid Unicode text (a lone surrogate at character {err.start})") from None


def _stops(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop", "must be a non-empty string or a list of them (every text holds the empty one)")
    return stops


def parse_tokenize(body: Any) -> tuple[str, bool]:
    """The text and ``add_special_tokens`` (default false) of a ``POST /tokenize`` body; :class:`BadRequest`."""
    if not isinstance(body, dict):
        raise BadRequest("body", f"must be a JSON object of fields, got {_json_type(body)}")
    unknown = sorted(set(body) - {"prompt", "add_special_tokens", "model"})
    if unknown:
        raise BadRequest(unknown[0], "unknown field; valid fields: prompt, add_special_tokens, model")
    get = _Fields(body)
    text = get.text("prompt", None)
    if text is None:
        raise BadRequest("prompt", "the text to tokenize (a string) is required")
    _check_unicode("prompt", text)
    return text, get.boolean("add_special_tokens", False)


def parse_detokenize(body: Any, vocab_size: int) -> list[int]:
    """The token ids of a ``POST /detokenize`` body, each in the vocabulary; :class:`BadRequest`."""
    if not isinstance(body, dict):
        raise BadRequest("body", f"must be a JSON object of fields, got {_json_type(body)}")
    unknown = sorted(set(body) - {"tokens", "model"})
    if unknown:
        raise BadRequest(unknown[0], "unknown field; valid fields: tokens, model")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("tokens", "must be a list of token ids (integers)")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest("tokens", f"token id {bad[0]} is outside the vocabulary 0..{vocab_size - 1}")
    return tokens
