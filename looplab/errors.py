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
