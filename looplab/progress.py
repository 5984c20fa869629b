"""Progress for output that is not a terminal (a log file, CI, a pipe): a line now and then, with an ETA.

On a terminal the tqdm bars speak; elsewhere they stay silent, and these lines
say how far a long job is — at most one every ``every_s`` seconds, and always
the last one.
"""

from __future__ import annotations

import sys
import time


def is_terminal() -> bool:
    """Whether progress bars (written to stderr) are shown on a terminal."""
    return sys.stderr.isatty()


def duration(seconds: float) -> str:
    """12 s, 3 min 05 s, 1 h 02 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressLines:
    """``what: done/total (pct), elapsed, ETA …`` lines on stdout, only when stderr is not a terminal.

    ``start`` counts work already done before this process began (a resumed run), which the
    rate and ETA leave out.
    """

    def __init__(self, what: str, total: int, start: int = 0, every_s: float = 10.0, enabled: bool = True):
        self.what, self.total, self.start, self.every_s = what, total, start, every_s
        self.enabled = enabled and not is_terminal()
        self.began = self.last = time.monotonic()

    def update(self, done: int, detail: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < self.total and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = now - self.began
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {duration((self.total - done) / rate)}" if rate > 0 and done < self.total else ""
        share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        print(
            f"{self.what}: {done}/{self.total}{share}{', ' + detail if detail else ''}, "
            f"elapsed {duration(elapsed)}{eta}",
            flush=True,
        )


class Progress:
    """Progress of a counted job: a tqdm bar on a terminal, :class:`ProgressLines` elsewhere.

    Use as a context manager; ``advance`` after each unit of work, with an optional detail
    (for example the loop just measured) shown on the line.
    """

    def __init__(self, what: str, total: int, unit: str = "it", enabled: bool = True, every_s: float = 10.0):
        from tqdm import tqdm

        self.done = 0
        self.lines = ProgressLines(what, total, every_s=every_s, enabled=enabled)
        self.bar = tqdm(
            total=total, desc=what, unit=unit, disable=None if enabled else True, leave=False, dynamic_ncols=True
        )

    def advance(self, count: int = 1, detail: str = "") -> None:
        self.done += count
        self.bar.update(count)
        if detail:
            self.bar.set_postfix_str(detail, refresh=False)
        self.lines.update(self.done, detail)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
