"""The task interface: length-controlled, seeded, mixed-length batches.

A task turns an instance size ``n`` into token sequences whose *answer region*
is supervised. Answers are produced all at once after K loops
(non-autoregressive), read at the answer positions, and scored by whole-answer
exact match.

Every task shares the special tokens ``<pad>`` (id 0), ``<sep>``, ``<q>`` (an
empty answer slot) and ``<s>`` (the start token); its own symbols follow.
Labels are ids in the same vocabulary, with :data:`IGNORE` outside the answer
region.

Every sequence starts with ``<s>`` at position 0, outside the answer region,
followed by the task's own layout (its *body*). The start token is always there,
not an option: with causal attention two positions whose prefixes hold the same
tokens see the same keys and values, so without a distinct first token the first
two positions of ``11 11 ...`` (or ``a a ...``) hold identical states in every
layer and loop and can never give different answers. A bidirectional model just
sees one more token.

To add a task: subclass :class:`Task`, implement ``symbols``, ``body_len``,
``steps`` and ``_sample_rows`` (the body, without the start token), and decorate
it with ``@register_task``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError, choice_error
from looplab.plugins import register_entry

PAD, SEP, QUERY, START = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<sep>", "<q>", "<s>")
IGNORE = -100


@dataclass
class TaskBatch:
    """A padded batch of task instances.

    Attributes:
        tokens: [B, L] long, :data:`PAD` after each row's own length.
        labels: [B, L] long, :data:`IGNORE` outside the answer region.
        valid: [B, L] bool, True on real (non-pad) positions.
        lengths: [B] long, the instance size n of each row.
    """

    tokens: Tensor
    labels: Tensor
    valid: Tensor
    lengths: Tensor

    @property
    def answer_mask(self) -> Tensor:
        """[B, L] bool: positions whose prediction is scored."""
        return self.labels != IGNORE

    def to(self, device) -> TaskBatch:
        return TaskBatch(*(t.to(device) for t in (self.tokens, self.labels, self.valid, self.lengths)))


class Task(ABC):
    """A length-controlled algorithmic task (docs/methods.md §2)."""

    name: str = ""
    #: whether whole-answer exact match over loops is this task's measure (False for language modelling)
    exact_match: bool = True
    #: whether the task is next-token prediction, which a model may only read causally
    needs_causal: bool = False
    #: whether the task's tokens are the bytes of text, so that a model of it reads and writes text (generation)
    is_text: bool = False
    #: the smallest and largest instance size the task can draw (None: no bound), and the largest it trains on
    min_size: int = 1
    max_size: int | None = None
    max_train_size: int | None = None

    def __init__(self, alphabet: int = 8):
        if alphabet < 2:
            raise LooplabError(f"task.alphabet must be >= 2, got {alphabet}")
        self.alphabet = alphabet
        self.vocab: list[str] = list(SPECIAL_TOKENS) + list(self.symbols())
        self.token_id = {tok: i for i, tok in enumerate(self.vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @abstractmethod
    def symbols(self) -> list[str]:
        """The task's own tokens (inputs and outputs), after the special ones."""

    @abstractmethod
    def body_len(self, n: int) -> int:
        """Length of the task's own layout for an instance of size n (without the start token)."""

    def seq_len(self, n: int) -> int:
        """Sequence length L(n) of an instance of size n: the start token and the body."""
        return 1 + self.body_len(n)

    @abstractmethod
    def steps(self, n: Tensor) -> Tensor:
        """T(n), the natural number of steps, elementwise on a long tensor."""

    @abstractmethod
    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``count`` instances of size ``n``, without the start token.

        Returns:
            tokens [count, body_len(n)] and labels [count, body_len(n)] (long).
        """

    @staticmethod
    def with_start(tokens: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Prepend ``<s>`` to rows [count, l] (its label is IGNORE): [count, l + 1] each."""
        start = torch.full((tokens.shape[0], 1), START, dtype=tokens.dtype)
        return torch.cat([start, tokens], 1), torch.cat([torch.full_like(start, IGNORE), labels], 1)

    def decode(self, ids: Tensor) -> str:
        """Token ids [L] → their symbols, space-separated; ``<pad>`` and :data:`IGNORE` are dropped.

        Works on inputs (``batch.tokens[i]``), targets (``batch.labels[i]``) and a model's
        predictions alike.
        """
        return " ".join(self.vocab[i] for i in ids.flatten().tolist() if i not in (PAD, IGNORE))

    def show(self, batch: TaskBatch, row: int, prediction: Tensor | None = None) -> str:
        """Row ``row`` of ``batch`` in words: its input, its answer and, if given, the
        predicted answer (``prediction`` [L] ids, read at the answer positions)."""
        answer = batch.answer_mask[row]
        lines = [
            f"n = {int(batch.lengths[row])}",
            f"input:  {self.decode(batch.tokens[row])}",
            f"answer: {self.decode(batch.labels[row][answer])}",
        ]
        if prediction is not None:
            lines.append(f"model:  {self.decode(prediction[answer])}")
        return "\n".join(lines)

    def ids(self, *tokens: str) -> Tensor:
        """Vocabulary ids of the given token strings, as a long tensor."""
        return torch.tensor([self.token_id[t] for t in tokens], dtype=torch.long)

    def sample(self, n: int, batch: int, generator: torch.Generator) -> TaskBatch:
        """``batch`` instances, all of size ``n``."""
        return self.sample_lengths(torch.full((batch,), n, dtype=torch.long), generator)

    def sample_lengths(self, lengths: Tensor, generator: torch.Generator) -> TaskBatch:
        """One instance per entry of ``lengths`` ([B] long), padded to a common L.

        Rows of equal length are drawn together, in increasing n, so the batch
        is a deterministic function of ``lengths`` and the generator state.
        """
        lengths = lengths.to(torch.long).cpu()
        if lengths.numel() == 0 or int(lengths.min()) < 1:
            raise LooplabError("task lengths must be >= 1")
        width = max(self.seq_len(int(n)) for n in lengths.unique())
        tokens = torch.full((len(lengths), width), PAD, dtype=torch.long)
        labels = torch.full((len(lengths), width), IGNORE, dtype=torch.long)
        valid = torch.zeros((len(lengths), width), dtype=torch.bool)
        for n in lengths.unique().tolist():
            rows = (lengths == n).nonzero().squeeze(1)
            row_tokens, row_labels = self.with_start(*self._sample_rows(n, len(rows), generator))
            span = row_tokens.shape[1]
            tokens[rows, :span] = row_tokens
            labels[rows, :span] = row_labels
            valid[rows, :span] = True
        return TaskBatch(tokens, labels, valid, lengths)


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available by its ``name``."""
    register_entry(TASKS, cls.name, cls, "task")
    return cls


def make_task(name: str, alphabet: int = 8) -> Task:
    """Instantiate a registered task by name."""
    if name not in TASKS:
        raise choice_error("task", name, TASKS)
    return TASKS[name](alphabet=alphabet)
