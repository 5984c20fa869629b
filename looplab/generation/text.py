"""Text in, text out (``looplab generate``): generation from a trained byte-level run or a model dir,
both opened as a :class:`~looplab.generation.text_lm.TextLM` (one path for every model kind).

For a byte-level run a prompt is the task's start token ``<s>`` followed by its
UTF-8 bytes (byte b is token 4 + b, as the KJV and chain-arithmetic tasks write
text), and the new tokens are decoded back to bytes, and to text with invalid
UTF-8 replaced; a model dir's own tokenizer does both for it. A row stops after
the model's end-of-text token (a model dir's tokenizer's; a byte LM has none), at
its first stop string (kept in its text), or after ``max_new_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from looplab.errors import LooplabError
from looplab.generation.byte_text import no_head_message
from looplab.generation.entry import Generation, generate
from looplab.generation.options import DecodeOptions
from looplab.generation.text_lm import TextLM, open_text_lm
from looplab.token_exits import GenerationExit


@dataclass
class Completion:
    """One prompt's continuation: its text, the loops each new token was read after, the new token ids
    (every generated one, the end-of-text token included) and the prompt's token ids."""

    prompt: str
    text: str
    depths: list[int]
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)


_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}


def unescape(text: str) -> str:
    """A stop string as typed in a shell: ``\\n``, ``\\t``, ``\\\\`` become a newline, a tab, a backslash."""
    return re.sub(r"\\[nt\\]", lambda found: _ESCAPES[found.group()], text)


def cut_at_stop(text: str, stops: list[str]) -> str | None:
    """``text`` up to and including its first stop string, or None when it holds none."""
    ends = [text.index(stop) + len(stop) for stop in stops if stop in text]
    return text[: min(ends)] if ends else None


def generate_text(
    source: str | Path | TextLM,
    prompts: list[str],
    max_new_tokens: int = 64,
    options: DecodeOptions | None = None,
    stops: list[str] = (),
    sources: list[str] | None = None,
    dtype: str = "float32",
) -> tuple[list[Completion], Generation]:
    """Continue each text prompt with a looped LM: a run dir's latest checkpoint or a model dir (any path
    :func:`~looplab.generation.text_lm.open_text_lm` opens, in ``dtype`` for a model dir), or a
    :class:`~looplab.generation.text_lm.TextLM` already open.

    ``options`` (:class:`~looplab.generation.options.DecodeOptions`) default to the model's fixed exit at its
    default loops (a run's fixed depth, a model dir's native loop count); the ``halting`` exit is given the
    run's halting head. A row stops after the model's end-of-text token or at its first stop string (kept in
    its text); ``sources`` name the prompts in errors (``prompts.txt line 3``); an empty stop string is
    refused (every text holds it).
    """
    for stop in stops:
        if not isinstance(stop, str) or not stop:
            raise LooplabError(f"a stop string must be non-empty text (every text holds the empty one), got {stop!r}")
    lm = source if isinstance(source, TextLM) else open_text_lm(source, dtype)
    options = options or DecodeOptions(lm.exit_rule())
    rule = options.exit_rule
    if rule.needs_head and rule.halts is None:
        options = replace(options, exit_rule=replace(rule, halts=_halts(lm, rule)))
    stops = list(stops)

    def finished(ids: list[int]) -> bool:
        if lm.eos is not None and ids[-1] == lm.eos:
            return True
        return bool(stops) and cut_at_stop(lm.decode(ids), stops) is not None

    prompts_ids = [lm.encode(p) for p in prompts]
    result = generate(lm.model, prompts_ids, max_new_tokens, options, finished, sources=sources)
    completions = []
    for prompt, prompt_ids, ids, depths in zip(prompts, prompts_ids, result.tokens, result.depths):
        text = lm.decode(ids)
        completions.append(Completion(prompt, cut_at_stop(text, stops) or text, depths, ids, prompt_ids))
    return completions, result


def _halts(lm: TextLM, rule: GenerationExit):
    """The halting head's decision for ``rule``: the model's, or a one-line error naming what it lacks."""
    if lm.halts is not None:
        return lm.halts
    if lm.kind == "run":
        from looplab.rundir import load_run_config

        raise LooplabError(no_head_message(load_run_config(lm.path).schedule.name))
    return lm.exit_rule(rule.name, rule.loops).halts  # raises: a model dir has no halting head
