"""The lm-evaluation-harness model ``looplab``: lm-eval's requests answered by looplab's own decoder.

    lm_eval --model looplab --model_args path=DIR,loops=8,exit=kl,eps=0.01,cache=per_loop --tasks ...

model_args (each checked at load; a bad one is a one-line :class:`~looplab.errors.LooplabError`)

    path          a looplab run dir of a text task, or any model dir looplab loads (required)
    loops         the fixed depth, or an adaptive exit's cap (default: the model's own depth)
    exit          a registered generation exit (fixed, kl, convergence, confidence, halting, gate, ...)
    cache         a KV cache policy (per_loop, shared, last_m, a plugin's) or none
    decoder       a registered decoder (step, depth, recompute, ...; scoring needs one that scores)
    eps, keep_loops, max_batch, ...  every parameter the chosen exit, cache and decoder declare (the exit's
                  over the run's ``[generate.exits.NAME]`` table), checked by the same parser as
                  ``looplab generate``'s flags and a server request's fields (:mod:`looplab.generation.fields`)
    dtype         float32 or bfloat16 (a model dir's weights; default: bfloat16 on a CPU with native bfloat16
                  arithmetic, else float32 — :func:`looplab.lm.dtypes.default_dtype`)
    weights       float (default) or int8: a model dir's linear layers as int8 (:mod:`looplab.lm.int8`; its
                  quality cost is logged)
    tokenizer     a model dir whose tokenizer is kept elsewhere (Parcae's): the folder holding it
    batch_size    rows per decoder call (lm-eval's ``--batch_size``; a positive integer)
    device        cpu, cuda, cuda:N (lm-eval's ``--device``; a CUDA device on a machine without one: cpu)
    prefix_token  the token an empty context and a rolling text start from (default: the model's start
                  token, else its end-of-text token)
    seed          the sampling generator's seed (``do_sample``)

Each request type is a looplab call on token ids, so the numbers are looplab's:

    loglikelihood          context and continuation split as lm-eval's HFLM does (encode context +
                           continuation, the continuation's tokens are the tail), then
                           ``generate(prompts=context, forced=continuation)`` — what
                           ``score(context + continuation, context=len(context))`` returns; ``is_greedy``
                           from a greedy generation of as many tokens (a second pass)
    loglikelihood_rolling  lm-eval's disjoint windows of ``max_context − 1`` predicted tokens (the
                           decoder's budget counts the last forced token too), each scored as above
    generate_until         ``generate`` from the context (left-truncated to leave ``max_gen_toks``),
                           stopping at an ``until`` string or the end-of-text token; greedy unless
                           ``do_sample`` (or a positive temperature), then sampled through looplab's
                           :class:`~looplab.generation.Sampling` (temperature, top_k); a decode field in
                           the task's ``generation_kwargs`` (``loops``, ``exit``, ``eps``, ``cache``,
                           ``decoder``, …) overrides the model_args' for that request

Every scored or generated token runs the loops its exit gives it (the context, as in any
generation, is prefilled to the cap). The depths of the latest call of each type are kept in
:attr:`LooplabLM.depths` (lm-eval's results have no place for them).
"""

from __future__ import annotations

import logging

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from looplab.errors import LooplabError, choice_error
from looplab.generation import DecodeOptions, Sampling, generate
from looplab.generation.fields import FieldError, decode_options, unknown_fields
from looplab.generation.text_lm import TextLM, open_text_lm
from looplab.harness import MODEL_NAME
from looplab.lm.dtypes import DTYPES, default_dtype
from looplab.lm.int8 import check_weights

__all__ = ["LooplabLM"]

log = logging.getLogger(__name__)

#: lm-eval's generation arguments this model reads (``top_p`` only at 1: looplab samples by top_k)
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")
DEFAULT_GEN_TOKS = 256  # HFLM's max_gen_toks


@register_model(MODEL_NAME)
class LooplabLM(TemplateLM):
    """A looplab LM as an lm-eval model (see the module docstring for its model_args)."""

    def __init__(
        self,
        path: str | None = None,
        dtype: str | None = None,
        batch_size: int | str | None = 1,
        max_batch_size: int | None = None,
        device: str | None = None,
        prefix_token: int | None = None,
        seed: int = 0,
        weights: str = "float",
        tokenizer: str | None = None,
        **fields,
    ):
        super().__init__()
        if not path:
            raise LooplabError("model_args needs path=DIR: a looplab run dir or a model dir")
        if "cache" in fields and fields["cache"] is None:
            fields["cache"] = "none"  # lm-eval's model_args parser reads cache=none as None
        if dtype is not None and dtype not in DTYPES:
            raise choice_error("model_arg dtype", dtype, DTYPES)
        self.batch_size = _positive("batch_size", 1 if batch_size is None else batch_size)
        self.seed = _integer("seed", seed)
        device = _device(device)
        dtype = dtype or default_dtype(device, weights)
        check_weights(weights, device, "model_arg weights")
        # a run's plugins are known from here
        self.lm: TextLM = open_text_lm(path, dtype, device, weights, tokenizer=tokenizer)
        if self.lm.weights_note:
            log.warning("looplab: %s", self.lm.weights_note)
        try:
            unknown, valid = unknown_fields(fields)
            if unknown:
                raise choice_error("looplab model_arg", unknown[0], (*_MODEL_ARGS, *valid))
            self.options = decode_options(fields, self.lm, Sampling(seed=self.seed))
        except FieldError as err:
            raise LooplabError(f"model_arg {err}") from None
        self.fields = fields  # a task's generation_kwargs may change any of them, per request
        self._prefix = self._prefix_token(prefix_token)
        # every refusal generate has (an exit the model cannot run, a cache it cannot use), now, in one line
        generate(self.lm.model, [[self._prefix]], 1, self.options)
        #: request type → per request, the loops each of its scored or generated tokens ran (latest call)
        self.depths: dict[str, list[list[int]]] = {}

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> LooplabLM:
        """The model of ``--model_args`` (each key once) and lm-eval's own options (``--batch_size``,
        ``--device``): a key in both is the model_args' (lm-eval passes its defaults too)."""
        from lm_eval.utils import handle_arg_string

        args: dict = {}
        for item in filter(None, (arg_string or "").split(",")):
            key, equals, value = item.partition("=")
            if not equals:
                raise LooplabError(f"model_args entry {item!r} is not KEY=VALUE")
            if key in args:
                raise LooplabError(f"model_arg {key} is given twice in --model_args; give each once")
            args[key] = handle_arg_string(value)
        return cls.create_from_arg_obj(args, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> LooplabLM:
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    # the tokenizer lm-eval sees ------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self._prefix if self.lm.eos is None else self.lm.eos

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    @property
    def max_length(self) -> int:
        return self.lm.max_context

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of ``string``, with the model's start tokens unless ``add_special_tokens`` is False."""
        return self.lm.encode(string, prompt=add_special_tokens is not False)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.lm.decode(list(tokens))

    # the three request types ---------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) per ``((context, continuation), context_ids, ids)``."""
        prompts, forced = [], []
        for _, context, continuation in requests:
            prompt, tail = self._fit(list(context), list(continuation))
            prompts.append(prompt)
            forced.append(tail)
        logprobs, depths = self._score(prompts, forced)
        greedy = self._greedy(prompts, forced)
        self.depths["loglikelihood"] = depths
        out = []
        for (pair, _, _), row, is_greedy in zip(requests, logprobs, greedy):
            answer = (float(sum(row)), is_greedy)
            self.cache_hook.add_partial("loglikelihood", pair, answer)
            out.append(answer)
        self._log("loglikelihood", depths)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log p(text) per request, from the prefix token, over windows of the model's context."""
        windows, owner = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(text, add_special_tokens=False)
            pairs = get_rolling_token_windows(tokens, self._prefix, self.lm.max_context - 1, context_len=1)
            for context, predicted in map(make_disjoint_window, pairs):
                windows.append((context, predicted))
                owner.append(index)
        logprobs, depths = self._score([c for c, _ in windows], [p for _, p in windows]) if windows else ([], [])
        totals = [0.0] * len(requests)
        per_request: list[list[int]] = [[] for _ in requests]
        for index, row, row_depths in zip(owner, logprobs, depths):
            totals[index] += float(sum(row))
            per_request[index] += row_depths
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        self.depths["loglikelihood_rolling"] = per_request
        self._log("loglikelihood_rolling", per_request)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """The continuation of each context, cut before its first ``until`` string."""
        out: list[str | None] = [None] * len(requests)
        depths: list[list[int]] = [[] for _ in requests]
        groups: dict[tuple, list[int]] = {}
        settings = [self._generation_settings(request.args[1]) for request in requests]
        for index, setting in enumerate(settings):
            groups.setdefault(_key(setting), []).append(index)
        for indices in groups.values():
            until, new, options = settings[indices[0]]
            room = self.lm.max_context - new
            if room < 1:
                raise LooplabError(
                    f"max_gen_toks = {new} leaves no room for a prompt in the model's context of "
                    f"{self.lm.max_context} tokens: it must be below {self.lm.max_context}"
                )
            prompts = {i: self.tok_encode(requests[i].args[0])[-room:] for i in indices}
            order = sorted(indices, key=lambda i: -len(prompts[i]))
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                result = generate(self.lm.model, [prompts[i] for i in batch], new, options, self._finished(until))
                for i, tokens, row_depths in zip(batch, result.tokens, result.depths):
                    out[i] = _cut(self.lm.decode(tokens), until)
                    depths[i] = row_depths
        for request, text in zip(requests, out):
            self.cache_hook.add_partial("generate_until", request.args, text)
        self.depths["generate_until"] = depths
        self._log("generate_until", depths)
        return out

    def _generation_settings(self, gen_kwargs: dict) -> tuple[list[str], int, DecodeOptions]:
        """(until strings, max new tokens, decode options) of one generate_until request's ``gen_kwargs``:
        lm-eval's generation arguments, and any decode field (``loops``, ``exit``, ``eps``, ``cache``,
        ``decoder``, …) over the model_args' own, read by the parser ``looplab generate`` and the server use."""
        kwargs = dict(gen_kwargs or {})
        decoding = {key: value for key, value in kwargs.items() if key not in GEN_KWARGS}
        fields = {**self.fields, **decoding}
        try:
            unknown, valid = unknown_fields(fields)  # model_args' own fields were checked: only gen_kwargs' remain
        except FieldError as err:
            raise LooplabError(f"generate_until argument {err}") from None
        if unknown:
            raise choice_error("generate_until argument", unknown[0], (*GEN_KWARGS, *valid))
        until = kwargs.get("until")
        if until is None:
            until = [] if self.lm.eos is None else [self.lm.decode([self.lm.eos])]
        until = [until] if isinstance(until, str) else list(until)
        if any(not isinstance(stop, str) for stop in until):
            raise LooplabError(f"generate_until's until must be strings, got {until!r}")
        until = [stop for stop in until if stop]
        new = _positive("max_gen_toks", kwargs.get("max_gen_toks", DEFAULT_GEN_TOKS))
        top_p = kwargs.get("top_p")
        if top_p is not None and top_p != 1:
            raise LooplabError(
                f"generate_until's top_p must be 1 (looplab samples from the top_k tokens), got {top_p!r}"
            )
        do_sample, temperature = kwargs.get("do_sample"), kwargs.get("temperature")
        sampling = Sampling()
        if do_sample is True or (do_sample is None and bool(temperature)):
            temperature = 1.0 if temperature is None else float(temperature)
            sampling = Sampling(temperature=temperature, top_k=int(kwargs.get("top_k") or 0), seed=self.seed)
        if not decoding:
            return until, new, self.options.but(sampling=sampling)
        try:
            return until, new, decode_options(fields, self.lm, sampling)
        except FieldError as err:
            raise LooplabError(f"generate_until argument {err}") from None

    # looplab calls -------------------------------------------------------------------------------

    def _score(self, prompts: list[list[int]], forced: list[list[int]]) -> tuple[list[list[float]], list[list[int]]]:
        """Per row, the log-probability and depth of each forced token after its prompt (batched)."""
        logprobs: list = [None] * len(prompts)
        depths: list = [None] * len(prompts)
        for batch in self._batches(prompts, forced):
            new = max(len(forced[i]) for i in batch)
            rows, forced_rows = [prompts[i] for i in batch], [forced[i] for i in batch]
            result = generate(self.lm.model, rows, new, self.options, forced=forced_rows)
            for i, row, row_depths in zip(batch, result.logprobs, result.depths):
                logprobs[i], depths[i] = row, row_depths
        return logprobs, depths

    def _greedy(self, prompts: list[list[int]], forced: list[list[int]]) -> list[bool]:
        """Per row, whether greedy decoding after its prompt gives exactly its forced tokens."""
        greedy = [False] * len(prompts)
        for batch in self._batches(prompts, forced):
            new = max(len(forced[i]) for i in batch)
            result = generate(self.lm.model, [prompts[i] for i in batch], new, self.options)
            for i, tokens in zip(batch, result.tokens):
                greedy[i] = tokens[: len(forced[i])] == forced[i]
        return greedy

    def _batches(self, prompts: list[list[int]], forced: list[list[int]]) -> list[list[int]]:
        """Row indices in batches of at most ``batch_size``, longest first, each batch's longest prompt plus
        its longest forced run within the model's context (the decoder sizes every row by those two)."""
        order = sorted(range(len(prompts)), key=lambda i: -(len(prompts[i]) + len(forced[i])))
        batches: list[list[int]] = []
        for i in order:
            last = batches[-1] if batches else None
            if (
                last is not None
                and len(last) < self.batch_size
                and max(len(prompts[j]) for j in (*last, i)) + max(len(forced[j]) for j in (*last, i))
                <= self.lm.max_context
            ):
                last.append(i)
            else:
                batches.append([i])
        return batches

    def _fit(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """The context left-truncated so that context + continuation fits the model's context (as HFLM)."""
        if not continuation:
            raise LooplabError("a loglikelihood request's continuation must hold at least one token")
        if len(continuation) >= self.lm.max_context:
            raise LooplabError(
                f"a continuation of {len(continuation)} tokens does not fit the model's context of "
                f"{self.lm.max_context} tokens with any context"
            )
        return context[-(self.lm.max_context - len(continuation)) :], continuation

    def _finished(self, until: list[str]):
        eos = self.lm.eos

        def finished(ids: list[int]) -> bool:
            if eos is not None and ids[-1] == eos:
                return True
            return bool(until) and any(stop in self.lm.decode(ids) for stop in until)

        return finished

    def _prefix_token(self, token: int | None) -> int:
        if token is not None:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.lm.vocab_size:
                raise LooplabError(f"model_arg prefix_token must be a token id in 0..{self.lm.vocab_size - 1}")
            return token
        start = self.lm.encode("", prompt=True)
        if start:
            return start[-1]
        if self.lm.eos is not None:
            return self.lm.eos
        raise LooplabError(
            f"{self.lm.name} has no start or end-of-text token for an empty context or a rolling text to start "
            "from: give model_arg prefix_token=ID"
        )

    def _log(self, kind: str, depths: list[list[int]]) -> None:
        flat = [d for row in depths for d in row]
        if flat:
            log.info("looplab %s: %d tokens, mean depth %.3f of %d", kind, len(flat), sum(flat) / len(flat),
                     self.options.exit_rule.loops)  # fmt: skip


#: the model_args beside the decode fields (:mod:`looplab.generation.fields`)
_MODEL_ARGS = (
    "path", "dtype", "batch_size", "max_batch_size", "device", "prefix_token", "seed", "weights", "tokenizer",
)  # fmt: skip


def _integer(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LooplabError(f"model_arg {name} must be an integer, got {value!r}")
    return value


def _positive(name: str, value) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LooplabError(f"model_arg {name} must be a positive integer, got {value!r}")
    return value


def _device(device: str | None) -> str:
    """lm-eval's CLI asks for cuda:0 unless told otherwise: without CUDA that means the CPU."""
    if device is None or (device.startswith("cuda") and not torch.cuda.is_available()):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not device.startswith("cuda"):
        raise LooplabError(f"model_arg device must be cpu, cuda or cuda:N, got {device!r}")
    return device


def _key(setting: tuple[list[str], int, DecodeOptions]) -> tuple:
    until, new, options = setting
    return tuple(until), new, options


def _cut(text: str, until: list[str]) -> str:
    """``text`` before its first ``until`` string (lm-eval's convention: the stop string is not returned)."""
    for stop in until:
        text = text.split(stop)[0]
    return text
