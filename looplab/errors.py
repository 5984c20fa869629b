"""User-facing errors.

Anything a user can cause (bad config key or value, missing run directory,
corrupt or mismatched checkpoint) raises :class:`LooplabError`. The CLI turns it
into one line on stderr and exit code 2; library callers get a normal exception.
"""


class LooplabError(Exception):
    """A problem with the user's input, described in one line; the CLI exits with ``exit_code``."""

    exit_code = 2


def choice_error(what: str, value: object, choices) -> LooplabError:
    """Build the standard "unknown X 'v'; valid: a, b, c" error."""
    valid = ", ".join(sorted(str(c) for c in choices))
    return LooplabError(f"unknown {what} {value!r}; valid choices: {valid}")


def one_line(err: BaseException | str, limit: int | None = 400) -> str:
    """The message of ``err`` on one line: its lines joined and its whitespace collapsed (a library's message
    wrapped over lines is not cut mid-sentence); past ``limit`` characters (None: no limit) it ends at the last
    sentence end before the limit (else at a word) and says so with " …". An empty message is the
    exception's type name."""
    text = " ".join(str(err).split())
    if not text and isinstance(err, BaseException):
        text = type(err).__name__
    if limit is None or len(text) <= limit:
        return text
    head = text[:limit]
    end = max(head.rfind(". "), head.rfind("; "))
    return (head[: end + 1] if end > limit // 2 else head.rsplit(" ", 1)[0]) + " …"
