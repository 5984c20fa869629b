"""Chain arithmetic as text (chain_arithmetic) and the looped-LM training mixture (kjv_arithmetic)."""

from __future__ import annotations

import re

import pytest
import torch

from looplab.errors import LooplabError
from looplab.tasks import IGNORE, PAD, START, make_task
from looplab.tasks.corpus import load_corpus
from looplab.tasks.reasoning import MIXTURE_WINDOW, KJVWithReasoning, problem_bytes
from looplab.tasks.text import BYTE_OFFSET


@pytest.fixture(scope="module")
def task():
    return make_task("chain_arithmetic")


def brute_force(question: str) -> int:
    """The answer by running the statements, independently of the generator's own bookkeeping."""
    *statements, query = question.split(";")
    values: dict[str, int] = {}
    for statement in statements:
        name, expression = statement.split("=")
        values[name] = eval(expression, {}, dict(values))  # digits, names, + and - only (checked below)
    assert re.fullmatch(r"[a-z]\?", query)
    return values[query[0]] % 10


@pytest.mark.parametrize("n", [1, 2, 5, 12, 25])
def test_answers_are_right_by_brute_force(task, n):
    batch = task.sample(n, 64, torch.Generator().manual_seed(n))
    for row in range(64):
        valid = batch.tokens[row][batch.valid[row]]
        assert int(valid[0]) == START
        text = task.decode(valid) + task.decode(batch.labels[row][-1:])  # the last byte is only a label
        question, answer = text[: text.index("?") + 1], text[text.index("?") + 1 :]
        assert re.fullmatch(rf"([a-z]=\d)(;[a-z]=[a-z][+-]1){{{n}}};[a-z]\?", question)
        names = re.findall(r"([a-z])=", question)
        assert len(set(names)) == n + 1  # distinct variables
        assert answer == f"{brute_force(question)}\n"


def test_only_the_answer_is_supervised_as_next_bytes(task):
    batch = task.sample(3, 16, torch.Generator().manual_seed(0))
    assert batch.tokens.shape[1] == problem_bytes(3) == 1 + task.body_len(3)
    scored = batch.labels != IGNORE
    assert (scored.sum(1) == 2).all()  # the digit and the newline
    # label i is the byte at i + 1: the digit follows '?', the newline follows the digit
    assert (batch.tokens[:, -2] == BYTE_OFFSET + ord("?")).all()
    assert (batch.labels[:, -2] == batch.tokens[:, -1]).all()
    assert (batch.labels[:, -1] == BYTE_OFFSET + ord("\n")).all()


def test_same_seed_same_problems_and_steps_are_the_size(task):
    a = task.sample(4, 8, torch.Generator().manual_seed(7))
    b = task.sample(4, 8, torch.Generator().manual_seed(7))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert task.steps(torch.tensor([1, 6])).tolist() == [1, 6]


@pytest.mark.parametrize(
    "n, message", [(0, "lengths must be >= 1"), (26, "needs 1 <= n <= 25"), (100, "needs 1 <= n <= 25")]
)
def test_sizes_outside_the_alphabet_are_one_line_errors(task, n, message):
    with pytest.raises(LooplabError, match=message):
        task.sample(n, 2, torch.Generator().manual_seed(0))


def test_mixture_rows_are_kjv_text_or_problems():
    mixture = make_task("kjv_arithmetic")
    assert isinstance(mixture, KJVWithReasoning) and mixture.vocab == make_task("kjv").vocab
    lengths = torch.tensor([1, 2, 3, 4] * 16)
    batch = mixture.sample_lengths(lengths, torch.Generator().manual_seed(3))
    assert batch.tokens.shape == (64, MIXTURE_WINDOW + 1)
    train = load_corpus().text("train")
    kinds = []
    for row in range(64):
        text = mixture.decode(batch.tokens[row][batch.valid[row]])
        if int(batch.valid[row].sum()) == MIXTURE_WINDOW + 1:  # a KJV window: every byte supervised
            assert text in train and (batch.labels[row, 1:] != IGNORE).all()
            kinds.append("text")
        else:  # a problem of its row's size, padded
            assert int(batch.valid[row].sum()) == problem_bytes(int(lengths[row]))
            assert (batch.tokens[row][~batch.valid[row]] == PAD).all()
            assert text.count(";") == int(lengths[row]) + 1
            kinds.append("problem")
    assert 16 < kinds.count("problem") < 48  # about half of each


def test_mixture_rejects_problems_longer_than_its_window():
    mixture = make_task("kjv_arithmetic")
    longest = mixture.max_train_size
    assert problem_bytes(longest) - 1 <= MIXTURE_WINDOW < problem_bytes(longest + 1) - 1
    with pytest.raises(LooplabError, match=f"up to {longest} steps"):
        mixture.sample_lengths(torch.tensor([longest + 1]), torch.Generator().manual_seed(0))


def brute_force_trace(question: str) -> str:
    """The value after every step, mod 10, by running the statements."""
    *statements, _ = question.split(";")
    values: dict[str, int] = {}
    trace = []
    for statement in statements:
        name, expression = statement.split("=")
        values[name] = eval(expression, {}, dict(values))
        trace.append(str(values[name] % 10))
    return "".join(trace[1:])


@pytest.mark.parametrize("n", [1, 3, 6])
def test_trace_answers_give_the_value_after_every_step(n):
    trace = make_task("chain_trace")
    batch = trace.sample(n, 32, torch.Generator().manual_seed(n))
    assert batch.tokens.shape[1] == problem_bytes(n, trace=True) == 1 + trace.body_len(n)
    assert ((batch.labels != IGNORE).sum(1) == n + 1).all()  # n digits and the newline
    for row in range(32):
        text = trace.decode(batch.tokens[row]) + trace.decode(batch.labels[row][-1:])
        question, answer = text[: text.index("?") + 1], text[text.index("?") + 1 :]
        assert answer == brute_force_trace(question) + "\n"
    # the last digit is chain_arithmetic's answer to the same question
    assert brute_force_trace(question)[-1] == str(brute_force(question))


def test_trace_mixture_holds_trace_problems_up_to_its_window():
    mixture = make_task("kjv_trace")
    longest = mixture.max_train_size
    assert problem_bytes(longest, trace=True) - 1 <= MIXTURE_WINDOW < problem_bytes(longest + 1, trace=True) - 1
    batch = mixture.sample_lengths(torch.tensor([longest] * 32), torch.Generator().manual_seed(2))
    problems = [row for row in range(32) if int((batch.labels[row] == IGNORE).sum()) > 1]  # text: all but <s>
    assert problems and all(int((batch.labels[row] != IGNORE).sum()) == longest + 1 for row in problems)
    with pytest.raises(LooplabError, match=f"up to {longest} steps"):
        mixture.sample_lengths(torch.tensor([longest + 1]), torch.Generator().manual_seed(0))
