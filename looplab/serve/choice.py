"""One choice of a completion: the engine jobs behind a prompt, the events they send back, and the
OpenAI-shaped pieces (text, ``logprobs``, ``finish_reason``, looplab's ``loops``) built from them.

A prompt runs one generation job (unless ``max_tokens`` is 0) and, for ``echo`` with ``logprobs``, one
scoring job: the prompt teacher-forced as :func:`looplab.generation.score` does (context: its first
token), so the echoed prompt's log-probabilities are each token's at its exit's depth.

Text follows OpenAI: a stop string ends the choice and is not part of its text (its tokens still are
in ``logprobs`` and ``loops``); a streamed chunk holds back what could still become a stop string or an
unfinished UTF-8 character.
"""

from __future__ import annotations

import asyncio
from typing import Any

from looplab.generation.text_lm import TextLM
from looplab.serve.batch import End, Failed, Job, Token
from looplab.serve.request import Completion

__all__ = ["Choice"]


class Choice:
    """The jobs of prompt ``index`` of ``request`` and what they have sent so far."""

    def __init__(self, index: int, request: Completion, lm: TextLM, loop: asyncio.AbstractEventLoop):
        self.index, self.request, self.lm = index, request, lm
        self.prompt, self.prompt_text = request.prompts[index], request.texts[index]
        self.events: asyncio.Queue = asyncio.Queue()
        self.generated: list[Token] = []
        self.scored: list[Token] = []
        self.finish: str | None = None
        self.error: str | None = None
        self.sent = 0  # characters of the completion's text already streamed
        self.jobs: list[Job] = []
        eos = lm.eos
        stops = request.stops

        def finished(ids: list[int]) -> bool:
            return (eos is not None and ids[-1] == eos) or (
                bool(stops) and _first_stop(lm.decode(ids), stops) is not None
            )

        def sink(kind: str):
            if request.stream:
                return lambda event: loop.call_soon_threadsafe(self.events.put_nowait, (kind, event))
            held: list[tuple[str, Token | End | Failed]] = []

            def hold(event) -> None:  # a whole response is read at its end: one wake-up of the loop per job
                held.append((kind, event))
                if isinstance(event, End | Failed):
                    loop.call_soon_threadsafe(self._deliver, held)

            return hold

        top = request.logprobs or 0
        common = dict(options=request.options, top=top)
        if request.echo and request.logprobs is not None and len(self.prompt) > 1:
            self.jobs.append(
                Job(self.prompt[:1], len(self.prompt) - 1, picking=request.picking, sink=sink("score"),
                    forced=self.prompt[1:], **common)
            )  # fmt: skip
        if request.max_tokens > 0:
            self.jobs.append(
                Job(self.prompt, request.max_tokens, picking=request.picking, sink=sink("generate"),
                    stops=finished if (eos is not None or stops) else None, **common)
            )  # fmt: skip
        self.open = len(self.jobs)
        if not self.jobs:
            self.finish = "length"

    def _deliver(self, events: list) -> None:
        for event in events:
            self.events.put_nowait(event)

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancelled.set()

    async def next_event(self) -> tuple[str, Any] | None:
        """The next event of this choice's jobs, or None once they have all ended."""
        if self.open == 0:
            return None
        kind, event = await self.events.get()
        if isinstance(event, Token):
            (self.scored if kind == "score" else self.generated).append(event)
        else:
            self.open -= 1
            if isinstance(event, Failed):
                self.error = event.message
            elif kind == "generate":
                self.finish = event.reason if isinstance(event, End) else None
            if self.open == 0 and self.finish is None and self.error is None:
                self.finish = "length"  # echo scoring only (max_tokens 0)
        return kind, event

    # -- what a response holds --------------------------------------------------------------------------

    def text(self) -> str:
        """The completion's text so far, cut before its first stop string."""
        text = self.lm.decode([t.token for t in self.generated])
        cut = _first_stop(text, self.request.stops)
        return text if cut is None else text[:cut]

    def delta(self, final: bool) -> str:
        """The text not streamed yet, less (unless ``final``) a tail that could still change."""
        text = self.text()
        end = len(text) if final or self.finish else len(text) - _unsettled(text, self.request.stops)
        delta = text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return delta

    def logprobs(self, tokens: list[Token], echo: list[Token | None] = (), start: int = 0) -> dict | None:
        """OpenAI's ``logprobs`` object of ``echo`` (the prompt's tokens, None where unscored) then ``tokens``;
        ``start`` is the text offset of the first."""
        if self.request.logprobs is None:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = start
        for token in [*echo, *tokens]:
            piece = self.lm.decode([token.token]) if token is not None else ""
            out["tokens"].append(piece)
            out["token_logprobs"].append(None if token is None or token.logprob is None else token.logprob)
            out["top_logprobs"].append(None if token is None or not token.top else self._top(token.top))
            out["text_offset"].append(offset)
            offset += len(piece)
        return out

    def _top(self, top: list[tuple[int, float]]) -> dict[str, float]:
        """The likeliest tokens keyed by their text; a token whose text is another's, or no text alone (a
        byte of a longer character), keyed ``token_id:N`` instead, so none is lost."""
        out: dict[str, float] = {}
        for token, logprob in top:
            key = self.lm.decode([token])
            if key in out or "\ufffd" in key:
                key = f"token_id:{token}"
            out[key] = logprob
        return out

    def echoed(self) -> list[Token | None]:
        """The prompt's tokens as :class:`Token` (the first unscored: None) when echo scoring ran."""
        if not self.scored:
            return [Token(t, None, 0, []) for t in self.prompt]
        return [Token(self.prompt[0], None, 0, []), *self.scored]

    def whole(self) -> dict:
        """The finished choice of a non-streamed response."""
        echo = self.request.echo
        prompt_tokens = self.echoed() if echo else []
        choice = {
            "index": self.index,
            "text": (self.prompt_text if echo else "") + self.text(),
            "logprobs": self.logprobs(self.generated, prompt_tokens),
            "finish_reason": self.finish,
            "looplab": {"loops": [t.depth for t in self.generated], "token_ids": [t.token for t in self.generated]},
        }
        if echo and self.scored:
            choice["looplab"]["prompt_loops"] = [None, *(t.depth for t in self.scored)]
        return choice


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Where the first stop string in ``text`` begins (None: none)."""
    starts = [text.find(stop) for stop in stops if stop in text]
    return min(starts) if starts else None


def _unsettled(text: str, stops: list[str]) -> int:
    """How many trailing characters of ``text`` may still change: an unfinished UTF-8 character (shown as
    U+FFFD) or the start of a stop string."""
    tail = len(text) - len(text.rstrip("\ufffd"))
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                tail = max(tail, size)
                break
    return tail
