"""Byte-level language modelling on the KJV corpus (docs/methods.md §7), as a task.

An instance of size n is a window of n + 1 consecutive bytes drawn uniformly
from the TRAIN split of :func:`looplab.tasks.corpus.load_corpus`; tokens are the
start token ``<s>`` (the BOS of every window, unsupervised) and the window's
first n bytes, labels its last n (next-byte prediction), so every byte position
is in the answer region and the trainer's per-row loss is the mean next-byte
cross-entropy. Byte b has token id 4 + b, after the four special tokens, so
the vocabulary has 260 entries; ``alphabet`` is ignored.

An LM needs causal attention: the KJV presets set ``model.causal = true``
(nothing here can enforce it — the task does not see the model).

``steps(n) = 4``: there is no natural step count for text; 4 is the fixed
training depth of the docs/methods.md §7 looped LM, so ``matched`` also trains at 4.
The whole-answer exact match of ``looplab eval`` is meaningless here (a whole
window right); use :func:`looplab.text.evaluate.lm_loss_by_loops` instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.tasks.base import SPECIAL_TOKENS, Task, register_task
from looplab.tasks.corpus import SPLITS, load_corpus

BYTE_OFFSET = len(SPECIAL_TOKENS)
TRAINING_DEPTH = 4


def byte_symbol(b: int) -> str:
    """Vocabulary name of byte ``b``: the character itself when printable ASCII, else ``<0xNN>``."""
    return chr(b) if 32 <= b < 127 else f"<0x{b:02x}>"


@register_task
class KJVText(Task):
    name = "kjv"
    exact_match = False
    needs_causal = True
    is_text = True
    #: the task whose problems are mixed into the text, row by row (None: text alone)
    problems: type[Task] | None = None

    def symbols(self) -> list[str]:
        return [byte_symbol(b) for b in range(256)]

    def body_len(self, n: int) -> int:
        return n

    def steps(self, n: Tensor) -> Tensor:
        return torch.full_like(n, TRAINING_DEPTH)

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self._windows(n, count, generator, "train")

    def sample_split(
        self, n: int, count: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[Tensor, Tensor]:
        """``count`` random windows of ``split`` ("train" or "val"), each after the start token.

        Returns:
            tokens [count, n + 1] and labels [count, n + 1] (long): ``<s>`` (label IGNORE), then
            n bytes whose labels are the next bytes.
        """
        return self.with_start(*self._windows(n, count, generator, split))

    def _windows(self, n: int, count: int, generator: torch.Generator, split: str) -> tuple[Tensor, Tensor]:
        """tokens [count, n] and labels [count, n]: ``count`` windows of n + 1 bytes, shifted by one."""
        if split not in SPLITS:
            raise LooplabError(f"unknown corpus split {split!r}; valid choices: {', '.join(SPLITS)}")
        data = load_corpus().split(split)
        if n + 1 > len(data):
            raise LooplabError(f"window {n} is longer than the {split} split ({len(data)} bytes)")
        starts = torch.randint(0, len(data) - n, (count,), generator=generator)
        windows = data[starts[:, None] + torch.arange(n + 1)].long() + BYTE_OFFSET
        return windows[:, :-1], windows[:, 1:]

    def decode(self, ids: Tensor) -> str:
        """Token ids [L] → text; special tokens are dropped."""
        raw = bytes(int(i) - BYTE_OFFSET for i in ids.flatten().tolist() if int(i) >= BYTE_OFFSET)
        return raw.decode("utf-8", errors="replace")
