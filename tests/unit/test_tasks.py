"""Tasks: labels against plain-Python references, determinism, padding, sampling."""

import pytest
import torch

from looplab.errors import LooplabError
from looplab.tasks import IGNORE, PAD, START, TASKS, make_task


def _sum_digits(pairs: list[str], base: int, out: list[str]) -> list[str]:
    """LSB-first digits of a + b, via Python ints, for aligned pair tokens."""
    a = sum(int(p[0]) * base**i for i, p in enumerate(pairs))
    b = sum(int(p[1]) * base**i for i, p in enumerate(pairs))
    total = a + b
    return [out[(total // base**i) % base] for i in range(len(pairs) + 1)]


def ref_binary_addition(tokens: list[str]) -> list[str | None]:
    assert tokens[-1] == "<end>"
    return _sum_digits(tokens[:-1], 2, ["0", "1"])


def ref_decimal_addition(tokens: list[str]) -> list[str | None]:
    assert tokens[-1] == "<end>"
    return _sum_digits(tokens[:-1], 10, [f"d{d}" for d in range(10)])


def _split_slots(tokens: list[str]) -> list[str]:
    n = (len(tokens) - 1) // 2
    assert tokens[n] == "<sep>" and tokens[n + 1 :] == ["<q>"] * n
    return tokens[:n]


def ref_copy(tokens: list[str]) -> list[str | None]:
    x = _split_slots(tokens)
    return [None] * (len(x) + 1) + list(x)


def ref_unique_set(tokens: list[str]) -> list[str | None]:
    x = _split_slots(tokens)
    seen, distinct = set(), []
    for s in x:
        if s not in seen:
            seen.add(s)
            distinct.append(s)
    return [None] * (len(x) + 1) + distinct + ["<none>"] * (len(x) - len(distinct))


def ref_dyck1(tokens: list[str]) -> list[str | None]:
    depth, broken, out = 0, False, []
    for t in tokens:
        depth += 1 if t == "(" else -1
        broken = broken or depth < 0
        out.append("<invalid>" if broken else "<open>" if depth > 0 else "<balanced>")
    return out


def ref_parity(tokens: list[str]) -> list[str | None]:
    assert tokens[-1] == "<q>"
    bits = [int(t) for t in tokens[:-1]]
    return [None] * len(bits) + ["odd" if sum(bits) % 2 else "even"]


REFERENCES = {
    "binary_addition": ref_binary_addition,
    "copy": ref_copy,
    "decimal_addition": ref_decimal_addition,
    "dyck1": ref_dyck1,
    "parity": ref_parity,
    "unique_set": ref_unique_set,
}
NAMES = sorted(REFERENCES)
BODY_LEN = {
    "binary_addition": lambda n: n + 1,
    "copy": lambda n: 2 * n + 1,
    "decimal_addition": lambda n: n + 1,
    "dyck1": lambda n: n,
    "parity": lambda n: n + 1,
    "unique_set": lambda n: 2 * n + 1,
}
SEQ_LEN = {name: (lambda n, body=body: 1 + body(n)) for name, body in BODY_LEN.items()}  # <s> first
STEPS = {
    "binary_addition": lambda n: n + 1,
    "copy": lambda n: n,
    "decimal_addition": lambda n: n + 1,
    "dyck1": lambda n: n,
    "parity": lambda n: n,
    "unique_set": lambda n: n,
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def decode_row(task, tokens, labels, length: int) -> tuple[list[str], list[str | None]]:
    """Positions 1..length−1 of a row as token strings (None = IGNORE), after checking that
    position 0 is the unsupervised start token."""
    assert int(tokens[0]) == START and int(labels[0]) == IGNORE and task.vocab[START] == "<s>"
    toks = [task.vocab[i] for i in tokens[1:length].tolist()]
    labs = [None if i == IGNORE else task.vocab[i] for i in labels[1:length].tolist()]
    return toks, labs


def test_every_task_is_registered():
    # the algorithmic tasks tested here, the text tasks (test_text_task.py, test_reasoning_task.py; "text", a model
    # dir's tokenizer: test_finetune_model_dir.py) and the puzzles (test_puzzles.py)
    text = ["kjv", "chain_arithmetic", "chain_trace", "kjv_arithmetic", "kjv_trace", "text"]
    extra = text + ["sudoku4", "sudoku9", "sudoku9_hard", "maze"]
    assert sorted(TASKS) == sorted(NAMES + extra)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 2, 5, 13])
def test_labels_match_reference(name, n):
    task = make_task(name)
    batch = task.sample(n, 64, gen(n))
    assert batch.tokens.shape == (64, SEQ_LEN[name](n))
    assert batch.valid.all()
    for tokens, labels in zip(batch.tokens, batch.labels):
        toks, labs = decode_row(task, tokens, labels, len(tokens))
        assert labs == REFERENCES[name](toks)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_batch_different_seed_different(name):
    task = make_task(name)
    a, b, c = (task.sample(10, 16, gen(s)) for s in (7, 7, 8))
    for field in ("tokens", "labels", "valid", "lengths"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize("name", NAMES)
def test_mixed_length_batch_is_padded_and_correct(name):
    task = make_task(name)
    lengths = torch.tensor([3, 9, 1, 9, 5, 3])
    batch = task.sample_lengths(lengths, gen(0))
    assert torch.equal(batch.lengths, lengths)
    assert batch.tokens.shape[1] == SEQ_LEN[name](9)
    for row, n in enumerate(lengths.tolist()):
        span = SEQ_LEN[name](n)
        assert batch.valid[row, :span].all() and not batch.valid[row, span:].any()
        assert (batch.tokens[row, span:] == PAD).all()
        assert (batch.labels[row, span:] == IGNORE).all()
        assert (batch.tokens[row, :span] != PAD).all()
        toks, labs = decode_row(task, batch.tokens[row], batch.labels[row], span)
        assert labs == REFERENCES[name](toks)


@pytest.mark.parametrize("name", NAMES)
def test_start_token_only_at_position_zero(name):
    task = make_task(name)
    batch = task.sample_lengths(torch.tensor([2, 7, 4]), gen(1))
    assert (batch.tokens[:, 0] == START).all()
    assert not (batch.tokens[:, 1:] == START).any()
    assert (batch.labels[:, 0] == IGNORE).all()
    assert START not in [task.token_id[s] for s in task.symbols()]


@pytest.mark.parametrize("name", NAMES)
def test_steps(name):
    n = torch.tensor([1, 4, 17])
    steps = make_task(name).steps(n)
    assert steps.tolist() == [STEPS[name](k) for k in n.tolist()]
    assert n.tolist() == [1, 4, 17]


def test_dyck1_labels_are_all_common():
    task = make_task("dyck1")
    labels = task.sample(20, 500, gen(0)).labels
    invalid, open_, balanced = task.ids("<invalid>", "<open>", "<balanced>").tolist()
    for cls in (invalid, open_, balanced):
        assert (labels == cls).float().mean() >= 0.10
    all_valid = (labels != invalid).all(dim=1).float().mean()
    assert 0.30 <= all_valid <= 0.80


def test_unique_set_rows_mostly_repeat():
    task = make_task("unique_set")
    n = 12
    batch = task.sample(n, 200, gen(0))
    none = task.token_id["<none>"]
    has_repeat = (batch.labels[:, n + 2 :] == none).any(dim=1)  # after <s>, the n symbols and <sep>
    assert has_repeat.float().mean() > 0.5


def test_unknown_task_lists_choices():
    with pytest.raises(LooplabError) as err:
        make_task("nope")
    for name in NAMES:
        assert name in str(err.value)


def test_the_text_tasks_say_so_themselves():
    """Whether a task's tokens are text is the task's own attribute (generation reads runs of these)."""
    text = {name for name, task in TASKS.items() if task.is_text}
    assert text == {"kjv", "kjv_arithmetic", "kjv_trace", "chain_arithmetic", "chain_trace"}
    # byte-level language modelling is text; task "text" models a model dir's tokens, which are not bytes
    assert all(task.is_text for name, task in TASKS.items() if not task.exact_match and name != "text")
