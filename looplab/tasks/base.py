"""The task interface: length-controlled, seeded, mixed-length batches.

A task turns an instance size ``n`` into token sequences whose *answer region*
is supervised. Answers are produced all at once after K loops
(non-autoregressive), read at the answer positions, and scored by whole-answer
exact match.

Every task shares the special tokens ``<pad>`` (id 0), ``<sep>`` and ``<q>``
(an empty answer slot); its own symbols follow. Labels are ids in the same
vocabulary, with :data:`IGNORE` outside the answer region.

To add a task: subclass :class:`Task`, implement ``symbols``, ``seq_len``,
``steps`` and ``_sample_rows``, and decorate it with ``@register_task``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from looplab.errors import LooplabError, choice_error

PAD, SEP, QUERY = 0, 1, 2
SPECIAL_TOKENS = ("<pad>", "<sep>", "<q>")
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

    def to(self, device) -> "TaskBatch":
        return TaskBatch(*(t.to(device) for t in (self.tokens, self.labels, self.valid, self.lengths)))


class Task(ABC):
    """A length-controlled algorithmic task (SPEC §2)."""

    name: str = ""
    #: whether whole-answer exact match over loops is this task's measure (False for language modelling)
    exact_match: bool = True

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
    def seq_len(self, n: int) -> int:
        """Sequence length L(n) of an instance of size n."""

    @abstractmethod
    def steps(self, n: Tensor) -> Tensor:
        """T(n), the natural number of steps, elementwise on a long tensor."""

    @abstractmethod
    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``count`` instances of size ``n``.

        Returns:
            tokens [count, seq_len(n)] and labels [count, seq_len(n)] (long).
        """

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
            row_tokens, row_labels = self._sample_rows(n, len(rows), generator)
            span = row_tokens.shape[1]
            tokens[rows, :span] = row_tokens
            labels[rows, :span] = row_labels
            valid[rows, :span] = True
        return TaskBatch(tokens, labels, valid, lengths)


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available by its ``name``."""
    TASKS[cls.name] = cls
    return cls


def make_task(name: str, alphabet: int = 8) -> Task:
    """Instantiate a registered task by name."""
    if name not in TASKS:
        raise choice_error("task", name, TASKS)
    return TASKS[name](alphabet=alphabet)
