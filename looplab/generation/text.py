"""Text in, text out: generation from a trained byte-level run (``looplab generate``).

A prompt is the task's start token ``<s>`` followed by its UTF-8 bytes (byte b
is token 4 + b, as the KJV and chain-arithmetic tasks write text); the new
tokens are decoded back to bytes, and to text with invalid UTF-8 replaced. A row
stops at its first stop string (kept in its text), or after ``max_new_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.exits import fixed_depth
from looplab.experiment import Experiment
from looplab.generation.decode import GREEDY, Generation, Sampling, generate
from looplab.generation.exits import GenerationExit
from looplab.schedules import Schedule
from looplab.tasks.base import START, TASKS
from looplab.tasks.text import BYTE_OFFSET


def encode(text: str) -> list[int]:
    """``<s>`` and the UTF-8 bytes of ``text`` as token ids."""
    return [START] + [BYTE_OFFSET + b for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    """The text of byte token ids (special tokens dropped)."""
    return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256).decode("utf-8", "replace")


@dataclass
class Completion:
    """One prompt's continuation: its text and the loops each new token was read after."""

    prompt: str
    text: str
    depths: list[int]


_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}


def unescape(text: str) -> str:
    """A stop string as typed in a shell: ``\\n``, ``\\t``, ``\\\\`` become a newline, a tab, a backslash."""
    return re.sub(r"\\[nt\\]", lambda found: _ESCAPES[found.group()], text)


def cut_at_stop(text: str, stops: list[str]) -> str | None:
    """``text`` up to and including its first stop string, or None when it holds none."""
    ends = [text.index(stop) + len(stop) for stop in stops if stop in text]
    return text[: min(ends)] if ends else None


def head_halts(schedule: Schedule):
    """The ``halting`` exit's decision from a run's halting head: ``(h [R, d], t) -> [R] bool``, the head
    read on each token's state alone (a sequence of one) at the loops its schedule decides at.

    Raises LooplabError when the schedule has no head.
    """
    if schedule.module is None:
        raise LooplabError(
            f"the halting exit needs a halting head; this run's {schedule.name!r} schedule has none "
            "(runs trained with act_bce, q_halt, rl_halting or pondernet have one)"
        )

    def halts(h: Tensor, t: int) -> Tensor:
        return schedule.halts(h[:, None], torch.ones(h.shape[0], 1, dtype=torch.bool, device=h.device), t)

    return halts


def generate_text(
    run_dir: str | Path,
    prompts: list[str],
    max_new_tokens: int = 64,
    exit_rule: GenerationExit | None = None,
    cache: str = "per_loop",
    sampling: Sampling = GREEDY,
    stops: list[str] = (),
    keep_loops: int = 2,
    sources: list[str] | None = None,
) -> tuple[list[Completion], Generation]:
    """Continue each text prompt with the latest checkpoint of ``run_dir``.

    ``exit_rule`` defaults to the run's fixed exit (``eval.exits.fixed.depth``, the depth it is read at); the
    ``halting`` exit is given the run's halting head (:func:`head_halts`). ``sources`` name the prompts in
    errors (``prompts.txt line 3``); an empty stop string is refused (every text holds it).
    """
    for stop in stops:
        if not isinstance(stop, str) or not stop:
            raise LooplabError(f"a stop string must be non-empty text (every text holds the empty one), got {stop!r}")
    exp = Experiment.from_run(run_dir)
    if not exp.task.is_text:
        text_tasks = sorted(name for name, task in TASKS.items() if task.is_text)
        raise LooplabError(
            f"run {run_dir} trains the {exp.task.name!r} task, whose tokens are not text; "
            f"generation reads runs of: {', '.join(text_tasks)}"
        )
    exit_rule = exit_rule or GenerationExit("fixed", fixed_depth(exp.config.eval))
    if exit_rule.needs_head:
        exit_rule = replace(exit_rule, halts=head_halts(exp.schedule))
    stops = list(stops)

    def finished(ids: list[int]) -> bool:
        return bool(stops) and cut_at_stop(decode(ids), stops) is not None

    prompts_ids = [encode(p) for p in prompts]
    result = generate(
        exp.model, prompts_ids, max_new_tokens, exit_rule, cache, sampling, finished, keep_loops, sources=sources
    )
    completions = []
    for prompt, ids, depths in zip(prompts, result.tokens, result.depths):
        text = decode(ids)
        completions.append(Completion(prompt, cut_at_stop(text, stops) or text, depths))
    return completions, result
