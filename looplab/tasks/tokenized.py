"""Language modelling with a model dir's own tokenizer, as a task (``text``): what a ``model.pretrained``
run fine-tunes on (``looplab.experiment`` binds the dir's tokenizer to it).

An instance of size n is a window of n + 1 consecutive tokens of the text, its start drawn uniformly
from the run's generator: the tokens are its first n, the labels its last n (next-token prediction), so
every position is scored and the trainer's per-row loss is the mean next-token cross-entropy. There is
no looplab start token: the vocabulary is the tokenizer's own (id i is its token i), which has no
``<s>`` of looplab's, and positions of real text differ without one. A batch of mixed sizes is padded
with id 0, which ``valid`` masks.

The text is the KJV corpus, split by whole books (:mod:`looplab.tasks.corpus`, splits ``train`` and
``val``), or ``text_file``, which is both splits. It is tokenised once per process and (tokenizer, text,
split), line by line and without special tokens, so that the corpus is tokenised in one batch: a token
never spans a line break, which a tokenizer that splits on whitespace never makes anyway.

``steps(n)`` is ``depth`` for every n: the experiment gives the model's own loop count, so ``matched``
fine-tunes at the loop count the model was trained at.

Unbound (``make_task("text")``, no tokenizer) the task has its flags, an empty vocabulary and depth 1,
and draws nothing: the experiment checks, before anything runs, that task ``text`` comes with a model dir.
"""

from __future__ import annotations

import torch
from torch import Tensor

from looplab.errors import LooplabError
from looplab.io import read_utf8_text
from looplab.tasks.base import Task, register_task
from looplab.tasks.corpus import SPLITS, load_corpus

__all__ = ["NEEDS_MODEL_DIR", "TokenizedText"]

NEEDS_MODEL_DIR = (
    "task 'text' reads its tokens with a model dir's tokenizer: set model.pretrained = DIR "
    "(task 'kjv' is the byte-level text task)"
)

#: (tokenizer name, vocabulary size, text source, split) → the text's token ids [N] (long)
_TOKENS: dict[tuple[str, int, str, str], Tensor] = {}


@register_task
class TokenizedText(Task):
    name = "text"
    exact_match = False
    needs_causal = True
    #: the tokens are the tokenizer's, not bytes: looplab's byte-level text generation does not read them
    is_text = False
    problems: type[Task] | None = None

    def __init__(self, alphabet: int = 8, tokenizer=None, text_file: str = "", depth: int = 1):
        """``tokenizer``: a transformers tokenizer (None: unbound); ``text_file``: the text ("" for KJV);
        ``depth``: T(n) for every n."""
        self.tokenizer, self.text_file, self.depth = tokenizer, text_file, depth
        super().__init__(alphabet)
        self.vocab = [] if tokenizer is None else list(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
        self.token_id = {token: i for i, token in enumerate(self.vocab)}

    def symbols(self) -> list[str]:
        return []  # the vocabulary is the tokenizer's, set in __init__

    def body_len(self, n: int) -> int:
        return n

    def seq_len(self, n: int) -> int:
        return n  # no start token

    def with_start(self, tokens: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        return tokens, labels  # no start token: the rows are the windows themselves

    def steps(self, n: Tensor) -> Tensor:
        return torch.full_like(n, self.depth)

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self._windows(n, count, generator, "train")

    def sample_split(
        self, n: int, count: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[Tensor, Tensor]:
        """``count`` random windows of ``split`` ("train" or "val"): tokens [count, n] and labels [count, n]."""
        return self._windows(n, count, generator, split)

    def check_window(self, n: int) -> None:
        """Refuse, in one line, a window of ``n`` tokens that the text (either split) cannot fill."""
        for split in SPLITS:
            self._check_split(n, split)

    def _check_split(self, n: int, split: str) -> Tensor:
        """The tokens of ``split``, refused in one line when they cannot fill a window of ``n``."""
        data = self.tokens(split)
        if n + 1 > len(data):
            where = self.text_file or f"the KJV {split} split"
            raise LooplabError(
                f"a window of {n} tokens needs {n + 1} tokens of text; {where} is {len(data)} tokens long "
                f"under the tokenizer of {self._tokenizer_name()}: use a shorter task.train_max / "
                "eval_lengths or a longer text"
            )
        return data

    def tokens(self, split: str) -> Tensor:
        """[N] long: the token ids of ``split`` of the text (tokenised once per process)."""
        if self.tokenizer is None:
            raise LooplabError(NEEDS_MODEL_DIR)
        if split not in SPLITS:
            raise LooplabError(f"unknown corpus split {split!r}; valid choices: {', '.join(SPLITS)}")
        source = self.text_file or "kjv"
        key = (self._tokenizer_name(), len(self.tokenizer), source, split if not self.text_file else "all")
        if key not in _TOKENS:
            text = read_utf8_text(self.text_file, "task.text_file") if self.text_file else load_corpus().text(split)
            lines = text.splitlines(keepends=True)
            ids = self.tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"] if lines else []
            _TOKENS[key] = torch.tensor([i for line in ids for i in line], dtype=torch.long)
        return _TOKENS[key]

    def _tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__)

    def _windows(self, n: int, count: int, generator: torch.Generator, split: str) -> tuple[Tensor, Tensor]:
        """tokens [count, n] and labels [count, n]: ``count`` windows of n + 1 tokens, shifted by one."""
        data = self._check_split(n, split)
        starts = torch.randint(0, len(data) - n, (count,), generator=generator)
        windows = data[starts[:, None] + torch.arange(n + 1)]
        return windows[:, :-1], windows[:, 1:]

    def decode(self, ids: Tensor) -> str:
        """Token ids [L] → text by the tokenizer; ids outside the vocabulary (padding's IGNORE) are dropped."""
        kept = [int(i) for i in ids.flatten().tolist() if 0 <= int(i) < len(self.vocab)]
        return self.tokenizer.decode(kept) if self.tokenizer is not None else ""
