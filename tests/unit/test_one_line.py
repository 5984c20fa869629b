"""A library's message becomes one line without being cut mid-sentence (looplab.errors.one_line), and the CLI's
error line is built from it."""

import pytest

from looplab.cli import describe_error
from looplab.errors import LooplabError, one_line

LONG = "".join(f"Sentence {n} says a little more. " for n in range(40))


@pytest.mark.parametrize(
    "err, expected",
    [
        (
            ValueError("size mismatch for\n  lm_head.weight: copying a param\nof shape [5, 4]"),
            "size mismatch for lm_head.weight: copying a param of shape [5, 4]",
        ),
        (ValueError(""), "ValueError"),
        ("  spaced\tout  ", "spaced out"),
        (ValueError(LONG), "".join(f"Sentence {n} says a little more. " for n in range(12)) + "…"),
        (ValueError("word " * 200), ("word " * 80).strip() + " …"),
    ],
)
def test_a_message_is_joined_onto_one_line_and_cut_only_where_it_says_so(err, expected):
    line = one_line(err)
    assert line == expected and "\n" not in line and len(line) <= 402


@pytest.mark.parametrize(
    "err, expected",
    [
        (LooplabError("model.d_model must be\nat least 1"), "model.d_model must be at least 1"),
        (RuntimeError("boom\nat the second line"), "RuntimeError: boom at the second line (LOOPLAB_DEBUG=1"),
        (FileNotFoundError(2, "No such file or directory", "runs/x"), "No such file or directory: runs/x"),
    ],
)
def test_the_cli_error_line_is_the_whole_message(err, expected):
    assert describe_error(err).startswith(expected)
