"""Chain arithmetic read by real decoding: greedy answers with a depth per token (docs/methods.md §9).

Each problem's question is the prompt; the answer is decoded greedily, one token
per step at the depth its exit chooses, until the newline that ends an answer
or as many tokens as the true answer has. A problem counts when the decoded
text equals the answer exactly; answer token i counts when it equals the true
token i (so for ``chain_trace`` answers, position i is the value after step
i + 1, and accuracy and depth can be read per answer position).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from looplab.generation.byte_text import decode, encode
from looplab.generation.entry import generate
from looplab.generation.options import DecodeOptions
from looplab.generation.text import cut_at_stop
from looplab.tasks.reasoning import ANSWER_END


@dataclass
class DecodedAnswers:
    """Greedy answers to a list of problems.

    Attributes:
        texts: each decoded answer, cut after its first newline.
        correct: [N] bool, the whole answer right.
        token_correct: per problem, whether each answer token is right (as many as the true answer's).
        depths: per problem, the loops each decoded token was read after.
        tokens: the number of tokens decoded in all.
    """

    texts: list[str]
    correct: np.ndarray
    token_correct: list[list[bool]]
    depths: list[list[int]]
    tokens: int

    @property
    def exact_match(self) -> float:
        return float(self.correct.mean()) if len(self.correct) else float("nan")

    @property
    def mean_depth(self) -> float:
        """Mean loops per decoded token (NaN when none)."""
        flat = [d for row in self.depths for d in row]
        return float(np.mean(flat)) if flat else float("nan")

    def by_position(self) -> list[tuple[int, float, float, int]]:
        """(answer position, token accuracy, mean depth, count) per position of the answer."""
        rows = []
        for position in range(max((len(c) for c in self.token_correct), default=0)):
            right = [c[position] for c in self.token_correct if len(c) > position]
            depth = [d[position] for d in self.depths if len(d) > position]
            rows.append((position, float(np.mean(right)), float(np.mean(depth)) if depth else float("nan"), len(right)))
        return rows


def decode_answers(model, problems: list[tuple[str, str]], options: DecodeOptions) -> DecodedAnswers:
    """Greedy answers to ``problems`` ((question, answer) texts), each token at its exit's depth, decoded with
    ``options`` (their sampling must be greedy)."""
    longest = max(len(answer) for _, answer in problems)

    def finished(ids: list[int]) -> bool:
        return cut_at_stop(decode(ids), [ANSWER_END]) is not None

    result = generate(model, [encode(q) for q, _ in problems], longest, options, finished)
    texts = [cut_at_stop(decode(ids), [ANSWER_END]) or decode(ids) for ids in result.tokens]
    token_correct = [
        [i < len(text) and text[i] == answer[i] for i in range(len(answer))]
        for text, (_, answer) in zip(texts, problems)
    ]
    correct = np.array([text == answer for text, (_, answer) in zip(texts, problems)])
    return DecodedAnswers(texts, correct, token_correct, result.depths, sum(map(len, result.tokens)))
