"""A looped LM with its own tokenizer, opened from any path looplab takes: the one object behind
``looplab generate``, the lm-evaluation-harness model and ``looplab serve``.

:func:`open_text_lm` reads

    a looplab run dir   (``config.toml``) of a text task: its latest checkpoint, the byte tokenizer
                        (``<s>`` then one token per UTF-8 byte), the run's fixed depth as the default
                        loops, its ``[generate.exits]`` tables and its halting head (if any);
    a model dir         (``config.json``, :mod:`looplab.lm.model_dir`): a native looped LM or a
                        retrofit, its own tokenizer, its native loop count as the default loops.

What every caller then needs is on :class:`TextLM`: ``encode`` / ``decode``, the exit a request
names (:meth:`TextLM.exit_rule`, its parameters completed from the run's tables), and the
model :func:`looplab.generation.generate` and :func:`looplab.generation.score` take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn

from looplab.errors import LooplabError
from looplab.lm.families import family_of
from looplab.token_exits import MAX_LOOPS, GenerationExit, token_exit_params

__all__ = ["TextLM", "open_text_lm"]


@dataclass
class TextLM:
    """A looped LM and its tokenizer (see the module docstring).

    Attributes:
        model: what :func:`looplab.generation.generate` and :func:`~looplab.generation.score` take.
        path: where it was opened from; ``kind``: ``run`` (a looplab run dir), ``native`` or ``retrofit``.
        name: how responses and tables name it.
        default_loops: the loops a request that names none runs at (a run's fixed depth, a model
            dir's native loop count).
        max_context: the longest sequence (prompt + new tokens) the model takes.
        eos: the end-of-text token a generation stops at (None: none; a byte LM has none).
        exit_tables: the run's ``[generate.exits.NAME]`` tables (a model dir: its config's, e.g. Ouro's
            ``early_exit_threshold`` as the ``gate`` exit's threshold).
        halts: the ``halting`` exit's decision from the run's halting head (None without one).
        weights_note: a model dir opened with int8 weights: what they cost in quality, one line
            (:class:`looplab.lm.int8.Int8Quality`); None otherwise.
        bos_text, eos_text: the texts of the token a sequence starts with (``<s>``, a tokenizer's BOS) and of
            its end-of-text token (None without one), which :meth:`encode` reads back as those tokens.
    """

    model: nn.Module
    path: Path
    kind: str
    name: str
    default_loops: int
    max_context: int
    eos: int | None
    _encode: Callable[[str, bool], list[int]] = field(repr=False)
    _decode: Callable[[list[int]], str] = field(repr=False)
    exit_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    halts: Callable | None = field(default=None, repr=False)
    weights_note: str | None = None
    bos_text: str | None = None
    eos_text: str | None = None

    @property
    def loop_cap(self) -> int:
        """The most loops a request may ask for."""
        return MAX_LOOPS

    @property
    def vocab_size(self) -> int:
        return self.model.lm_head.out_features if hasattr(self.model, "lm_head") else self.model.head.out_features

    def encode(self, text: str, prompt: bool = True) -> list[int]:
        """Token ids of ``text``: with the tokens a sequence starts with (``<s>``, a BOS) when ``prompt``,
        without them for a continuation."""
        return self._encode(text, prompt)

    def decode(self, ids: list[int]) -> str:
        """The text of token ids, special tokens dropped."""
        return self._decode(ids)

    def exit_rule(self, name: str = "fixed", loops: int | None = None, **params) -> GenerationExit:
        """The exit ``name`` at ``loops`` (default :attr:`default_loops`), its parameters ``params`` over the
        run's ``[generate.exits.NAME]`` table; the ``halting`` exit gets the run's head. One-line errors."""
        loops = self.default_loops if loops is None else loops
        if isinstance(loops, bool) or not isinstance(loops, int) or not 1 <= loops <= self.loop_cap:
            raise LooplabError(f"loops must be an integer in 1..{self.loop_cap}, got {loops!r}")
        rule = GenerationExit(name, loops, token_exit_params(name, self.exit_tables, **params))
        family = family_of(self.model)
        if rule.needs_gate and (family is None or not family.view.capabilities.gate):
            raise LooplabError(f"the {name} exit reads a learned exit gate, which {self.name} lacks (Ouro has one)")
        if rule.needs_head:
            if self.halts is None and self.kind == "run":
                from looplab.generation.byte_text import no_head_message
                from looplab.rundir import load_run_config

                raise LooplabError(no_head_message(load_run_config(self.path).schedule.name))
            if self.halts is None:
                raise LooplabError(
                    f"the {name} exit needs a halting head, which {self.name} lacks "
                    "(looplab runs trained with act_bce, q_halt, rl_halting or pondernet have one)"
                )
            rule = replace(rule, halts=self.halts)
        return rule


def open_text_lm(
    path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "float",
    announce: Callable[[str], None] | None = None,
    tokenizer: str | Path | None = None,
) -> TextLM:
    """The :class:`TextLM` of a looplab run dir or a model dir (``dtype``, ``weights`` — ``float`` or
    ``int8`` (:mod:`looplab.lm.int8`) — and ``tokenizer``, the tokenizer's folder where the dir holds none,
    apply to a model dir). ``announce``, when given, is called with one line
    saying what a model dir's weights will take before they are read."""
    from looplab.lm.dtypes import DTYPES
    from looplab.lm.int8 import check_weights
    from looplab.lm.model_dir import is_model_dir, open_model_dir

    path = Path(path)
    check_weights(weights, device, "weights")
    if is_model_dir(path):
        if dtype not in DTYPES:
            raise LooplabError(f"unknown dtype {dtype!r}; valid choices: {', '.join(DTYPES)}")
        model_dir = open_model_dir(path, tokenizer)
        model_dir.check_fits(DTYPES[dtype], device, "loading")
        if announce is not None:
            announce(model_dir.memory_line(DTYPES[dtype], device))
        lm = _model_dir_lm(model_dir.load(DTYPES[dtype], device), path, model_dir, model_dir.kind, model_dir.name)
        if weights == "int8":
            from looplab.lm.int8 import held_text_quality

            lm.weights_note = held_text_quality(lm.model, model_dir.tokenizer, lm.default_loops).line()
        return lm
    if weights != "float":
        raise LooplabError(f"{weights} weights apply to a model dir (config.json); {path} is a looplab run")
    if tokenizer is not None:
        raise LooplabError(
            f"a tokenizer applies to a model dir (config.json); {path} is a looplab run, read as trained"
        )
    return _open_run(path, device)


def _model_dir_lm(model: nn.Module, path: Path, model_dir, kind: str, name: str) -> TextLM:
    """The :class:`TextLM` of ``model`` (a model dir's adapter) with ``model_dir``'s tokenizer, native loops,
    window and exit defaults."""
    tokenizer = model_dir.tokenizer

    def encode(text: str, prompt: bool) -> list[int]:
        return list(tokenizer(text, add_special_tokens=prompt)["input_ids"])

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    eos = tokenizer.eos_token_id
    return TextLM(
        model, path, kind, name, model_dir.native_loops, model_dir.max_window, None if eos is None else int(eos),
        encode, decode, model_dir.exit_defaults, bos_text=tokenizer.bos_token, eos_text=tokenizer.eos_token,
    )  # fmt: skip


def _open_run(path: Path, device: str) -> TextLM:
    from looplab.exits import fixed_depth
    from looplab.experiment import Experiment
    from looplab.generation.byte_text import START_TEXT, decode, encode, head_halts
    from looplab.tasks.base import TASKS

    exp = Experiment.from_run(path)
    if exp.source is not None:  # fine-tuned from a model dir: that dir's tokenizer, loops and exits
        name = f"looplab run {path.name} (fine-tuned from {exp.source.name})"
        return _model_dir_lm(exp.model.to(device), path, exp.source, "run", name)
    if not exp.task.is_text:
        text_tasks = sorted(name for name, task in TASKS.items() if task.is_text)
        raise LooplabError(
            f"run {path} trains the {exp.task.name!r} task, whose tokens are not text; "
            f"text generation reads runs of: {', '.join(text_tasks)}"
        )
    halts = head_halts(exp.schedule) if exp.schedule.module is not None else None
    model = exp.model.to(device)

    def encode_text(text: str, prompt: bool) -> list[int]:
        ids = encode(text)
        return ids if prompt else ids[1:]

    return TextLM(
        model, path, "run", f"looplab run {path.name}", fixed_depth(exp.config.eval), exp.config.model.max_len,
        None, encode_text, decode, dict(exp.config.generate.exits), halts, bos_text=START_TEXT,
    )  # fmt: skip
