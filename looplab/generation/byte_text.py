"""What a byte-level looplab run's text is (:mod:`looplab.generation.text` and :mod:`looplab.generation.text_lm`
read it): a prompt is the task's start token ``<s>`` and its UTF-8 bytes (byte b is token 4 + b, as the KJV
and chain-arithmetic tasks write text), the text ``<s>`` inside it being that token (as a transformers tokenizer
reads its special tokens' text); and the ``halting`` exit's decision from the run's halting head."""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.schedules import Schedule
from looplab.tasks.base import SPECIAL_TOKENS, START
from looplab.tasks.text import BYTE_OFFSET

__all__ = ["START_TEXT", "decode", "encode", "head_halts", "no_head_message"]

#: the start token's text
START_TEXT = SPECIAL_TOKENS[START]


def encode(text: str) -> list[int]:
    """``<s>`` and the UTF-8 bytes of ``text`` as token ids, each ``<s>`` in ``text`` the start token."""
    ids = [START]
    for index, piece in enumerate(text.split(START_TEXT)):
        ids += ([START] if index else []) + [BYTE_OFFSET + b for b in piece.encode("utf-8")]
    return ids


def decode(ids: list[int]) -> str:
    """The text of byte token ids (special tokens dropped)."""
    return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256).decode("utf-8", "replace")


def head_halts(schedule: Schedule):
    """The ``halting`` exit's decision from a run's halting head: ``(h [R, d], t) -> [R] bool``, the head
    read on each token's state alone (a sequence of one) at the loops its schedule decides at.

    Raises LooplabError when the schedule has no head.
    """
    if schedule.module is None:
        raise LooplabError(no_head_message(schedule.name))

    def halts(h: Tensor, t: int) -> Tensor:
        return schedule.halts(h[:, None], torch.ones(h.shape[0], 1, dtype=torch.bool, device=h.device), t)

    return halts


def no_head_message(schedule: str) -> str:
    return (
        f"the halting exit needs a halting head; this run's {schedule!r} schedule has none "
        "(runs trained with act_bce, q_halt, rl_halting or pondernet have one)"
    )
