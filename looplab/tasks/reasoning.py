"""Multi-step arithmetic written as text, for looped language models (docs/methods.md §6).

An instance of size n is a chain of n assignments after a starting value, each
reading the variable defined just before it, then a query for the last one:

    k=7;q=k+1;z=q+1;z?9

Variable names are n + 1 distinct lowercase letters, the start value a digit
0..9, each step adds or subtracts 1 (``+1`` or ``-1``, even odds), and the
answer is the last value mod 10 — one digit — followed by a newline that ends
it. (Steps of ±1 keep each step a 20-entry table a small model learns in a few
hundred updates; with operands 1..9, a 180-entry table, a one-step problem was
still at chance after 500 updates.) The text is bytes in the KJV task's
vocabulary (byte b has id 4 + b), so one byte-level model reads both.

As a language model reads it: tokens are ``<s>`` and the text without its last
byte, labels the next byte, supervised only where the next byte is part of the
answer (the digit, then the newline). Greedy decoding returns the right answer
exactly when the argmax at both answer positions is right given the true prefix,
so the whole-answer exact match on this layout IS greedy-decoding exact match,
and one unroll reads it at every loop count.

Depth matters: each step needs the value of the one before it, so n steps are a
chain of n dependent look-ups; ``steps(n) = n``. Train on small n, hold out
longer chains.

:class:`ChainTrace` (``chain_trace``) asks for the value after every step instead
of the last, mod 10, one digit each, then the newline: ``k=7;q=k+1;z=q+1;z?89``.
An n-step answer is n + 1 tokens, each one dependent look-up past the one before,
so read by real decoding its accuracy can be traded against depth per token.

:class:`KJVWithReasoning` (``kjv_arithmetic``) is the training mixture of a
looped LM: every row is, independently with probability one half, a KJV window
(every next byte supervised) or one such problem (its answer supervised), padded
to the window. Its loss is the mean over rows, so the two halves weigh the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.tasks.base import IGNORE, PAD, Task, TaskBatch, register_task
from looplab.tasks.text import BYTE_OFFSET, KJVText

LETTERS = "abcdefghijklmnopqrstuvwxyz"
MAX_STEPS = len(LETTERS) - 1
ANSWER_END = "\n"
#: bytes of the text of an n-step problem: "k=7", n × ";q=k+5", ";q?", the digit and the newline
PROBLEM_BYTES = (3, 6, 3 + 2)
#: extra bytes of a trace answer (the value after each step) per step beyond the first
TRACE_STEP_BYTES = 1
#: the mixture's window: every row is this many tokens (the KJV task's ``n``)
MIXTURE_WINDOW = 48
#: probability that a row of the mixture is a reasoning problem rather than KJV text
REASONING_FRACTION = 0.5


def problem_bytes(n: int, trace: bool = False) -> int:
    """Length in bytes of the text of an n-step problem, answer and newline included."""
    start, step, end = PROBLEM_BYTES
    return start + step * n + end + (TRACE_STEP_BYTES * (n - 1) if trace else 0)


def write_problem(names: list[str], start: int, ops: list[str], trace: bool = False) -> tuple[str, str]:
    """(question, answer) text of one chain: ``names`` has one letter more than ``ops``; the answer is the
    last value mod 10, or with ``trace`` the value after every step."""
    statements = [f"{names[0]}={start}"]
    value, values = start, []
    for previous, name, op in zip(names, names[1:], ops):
        statements.append(f"{name}={previous}{op}1")
        value = value + 1 if op == "+" else value - 1
        values.append(str(value % 10))
    answer = "".join(values) if trace else values[-1]
    return ";".join(statements) + f";{names[-1]}?", f"{answer}{ANSWER_END}"


def draw_problems(n: int, count: int, generator: torch.Generator, trace: bool = False) -> list[tuple[str, str]]:
    """``count`` (question, answer) pairs of n steps, every choice from ``generator``."""
    if not 1 <= n <= MAX_STEPS:
        raise LooplabError(f"chain_arithmetic needs 1 <= n <= {MAX_STEPS} (distinct variable letters), got {n}")
    names = torch.rand(count, len(LETTERS), generator=generator).argsort(dim=1)[:, : n + 1]
    starts = torch.randint(0, 10, (count,), generator=generator)
    plus = torch.rand(count, n, generator=generator) < 0.5
    return [
        write_problem(
            [LETTERS[i] for i in names[row].tolist()],
            int(starts[row]),
            ["+" if p else "-" for p in plus[row].tolist()],
            trace,
        )
        for row in range(count)
    ]


def encode_text(text: str) -> Tensor:
    """ASCII text → byte token ids [len(text)] (long)."""
    return torch.tensor(list(text.encode("ascii")), dtype=torch.long) + BYTE_OFFSET


def problem_rows(problems: list[tuple[str, str]]) -> tuple[Tensor, Tensor]:
    """tokens and labels [count, bytes − 1] of equal-length problems, read as next-byte prediction.

    Labels are IGNORE except where the next byte belongs to the answer.
    """
    texts = torch.stack([encode_text(q + a) for q, a in problems])
    question = len(problems[0][0])
    labels = texts[:, 1:].clone()
    labels[:, : question - 1] = IGNORE
    return texts[:, :-1], labels


@register_task
class ChainArithmetic(Task):
    name = "chain_arithmetic"
    max_size = MAX_STEPS
    needs_causal = True
    is_text = True
    #: the answer is the value after every step (:class:`ChainTrace`), not only the last
    trace = False

    # the byte vocabulary and its decoding are the KJV task's, so one model reads both
    symbols = KJVText.symbols
    decode = KJVText.decode

    def body_len(self, n: int) -> int:
        return problem_bytes(n, self.trace) - 1

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def draw(self, n: int, count: int, generator: torch.Generator) -> list[tuple[str, str]]:
        """``count`` (question, answer) texts of n steps, in this task's answer form."""
        return draw_problems(n, count, generator, self.trace)

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return problem_rows(self.draw(n, count, generator))


@register_task
class ChainTrace(ChainArithmetic):
    """Chain arithmetic answered with the value after every step (see the module docstring)."""

    name = "chain_trace"
    trace = True


@register_task
class KJVWithReasoning(KJVText):
    """KJV text and chain-arithmetic problems, row by row (the looped-LM training mixture).

    ``n`` is the problem's step count; every row has ``MIXTURE_WINDOW`` + 1 tokens.
    Validation text (``sample_split``) is KJV windows, as for ``kjv``.
    """

    name = "kjv_arithmetic"
    max_size = MAX_STEPS  # of the problems it is evaluated on
    max_train_size = (MIXTURE_WINDOW + 1 - PROBLEM_BYTES[0] - PROBLEM_BYTES[2]) // PROBLEM_BYTES[1]
    #: the problems' task
    problems = ChainArithmetic

    def __init__(self, alphabet: int = 8):
        super().__init__(alphabet)
        self.reasoning = self.problems(alphabet)

    def body_len(self, n: int) -> int:
        return MIXTURE_WINDOW

    def steps(self, n: Tensor) -> Tensor:
        return n.clone()

    def sample_lengths(self, lengths: Tensor, generator: torch.Generator) -> TaskBatch:
        """Rows of KJV text or of an n-step problem (probability :data:`REASONING_FRACTION`).

        Which rows are problems is drawn first, then the KJV windows, then the
        problems in increasing n: a deterministic function of ``lengths`` and the generator.
        """
        lengths = lengths.to(torch.long).cpu()
        if lengths.numel() == 0 or int(lengths.min()) < 1:
            raise LooplabError("task lengths must be >= 1")
        longest = int(lengths.max())
        if self.reasoning.body_len(longest) > MIXTURE_WINDOW:
            raise LooplabError(
                f"kjv_arithmetic rows hold problems of up to {self.max_train_size} steps "
                f"in their {MIXTURE_WINDOW}-byte window, got n = {longest}"
            )
        reasoning = torch.rand(len(lengths), generator=generator) < REASONING_FRACTION
        width = self.seq_len(longest)
        tokens = torch.full((len(lengths), width), PAD, dtype=torch.long)
        labels = torch.full((len(lengths), width), IGNORE, dtype=torch.long)
        valid = torch.zeros((len(lengths), width), dtype=torch.bool)
        text_rows = (~reasoning).nonzero().squeeze(1)
        if len(text_rows):
            tokens[text_rows], labels[text_rows] = self.with_start(
                *self._windows(MIXTURE_WINDOW, len(text_rows), generator, "train")
            )
            valid[text_rows] = True
        for n in lengths[reasoning].unique().tolist():
            rows = (reasoning & (lengths == n)).nonzero().squeeze(1)
            row_tokens, row_labels = self.reasoning.with_start(*self.reasoning._sample_rows(n, len(rows), generator))
            span = row_tokens.shape[1]
            tokens[rows, :span], labels[rows, :span] = row_tokens, row_labels
            valid[rows, :span] = True
        return TaskBatch(tokens, labels, valid, lengths)


@register_task
class KJVWithTrace(KJVWithReasoning):
    """KJV text and :class:`ChainTrace` problems, row by row: the mixture whose answers are several tokens."""

    name = "kjv_trace"
    max_train_size = (MIXTURE_WINDOW + 1 - PROBLEM_BYTES[0] - PROBLEM_BYTES[2] + TRACE_STEP_BYTES) // (
        PROBLEM_BYTES[1] + TRACE_STEP_BYTES
    )
    problems = ChainTrace
