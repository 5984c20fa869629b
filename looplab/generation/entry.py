"""Autoregressive generation from a causal looped transformer, with a KV cache and a depth per token.

:func:`generate` takes a batch of prompts of different lengths (token ids) and a
:class:`~looplab.generation.options.DecodeOptions`, checks them (:mod:`looplab.generation.checks`), and
hands them to the chosen decoder (:mod:`looplab.generation.decoders`). The default, ``step``
(:mod:`looplab.generation.step`), runs the prompts through the model once (the prefill, every prompt
token to the exit's cap), then one token per row per step: each step runs the new token's loops until the
exit rule (:mod:`looplab.token_exits`) stops it, reads the next-token distribution from that state,
and picks the next token (greedy, or sampled with a temperature and top-k from a seeded generator). The
cache policy (:mod:`looplab.generation.policies`) decides which earlier keys and values a token reads;
``none`` recomputes the whole sequence at every step instead (the ``recompute`` decoder: the reference the
cached paths are tested against; fixed depth only)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from looplab.errors import LooplabError
from looplab.generation import depthwise, recompute, speculative, wavefront  # noqa: F401 (they register)
from looplab.generation.checks import check_decoded, check_exact_claim, check_generation
from looplab.generation.options import DecodeOptions
from looplab.generation.sampling import Generation, Sampling
from looplab.generation.step import Decoder
from looplab.generation.views import decodable
from looplab.lm.native import NativeLoop
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model import LoopedTransformer
from looplab.plugins import run_entry
from looplab.token_exits import GenerationExit

__all__ = ["Generation", "Sampling", "generate", "score", "GREEDY", "FIXED_EXIT", "Decoder"]

#: the defaults of :func:`generate`: greedy decoding at a fixed 4 loops
GREEDY = Sampling()
FIXED_EXIT = GenerationExit()


@torch.no_grad()
def generate(
    model: LoopedTransformer | RetrofittedLoop | NativeLoop,
    prompts: list[list[int]],
    max_new_tokens: int,
    options: DecodeOptions | None = None,
    finished: Callable[[list[int]], bool] | None = None,
    forced: list[list[int]] | None = None,
    sources: list[str] | None = None,
) -> Generation:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a causal looplab model, a retrofitted pretrained LM (:mod:`looplab.generation.retrofit`) or a
            native looped LM's adapter (:mod:`looplab.lm.native`).
        prompts: token ids per row (each non-empty; the task's start token first, as in training).
        options: the exit, cache, decoder (each with its parameters) and sampling
            (:class:`~looplab.generation.options.DecodeOptions`; default: greedy, fixed 4 loops, ``per_loop``
            cache, the ``step`` decoder).
        finished: called with a row's generated ids after each token; True ends that row.
        forced: the tokens each row takes instead of picking one (teacher forcing, for
            :func:`score`); a row ends with its forced tokens.
        sources: where each prompt came from (``prompts.txt line 3``), for the error that refuses one
            too long to continue (:mod:`looplab.generation.budget`; default: its index).
    """
    options = options or DecodeOptions()
    model = decodable(model, gated=options.exit_rule.needs_gate)
    check_generation(model, prompts, max_new_tokens, options, forced, sources)
    was_training = model.training
    model.eval()
    try:
        method = options.method
        result = run_entry("decoder", options.decoder, method, method.decode, model, prompts, max_new_tokens,
                           options, finished, forced)  # fmt: skip
        checked = check_decoded(result, prompts, max_new_tokens, options, model.head.out_features, forced)
        check_exact_claim(checked, model, prompts, options, forced)
        return checked
    finally:
        model.train(was_training)


def score(
    model: LoopedTransformer | RetrofittedLoop | NativeLoop,
    sequences: list[list[int]],
    options: DecodeOptions | None = None,
    context: int = 1,
) -> Generation:
    """Teacher-forced decoding: each row's first ``context`` tokens are its prompt, and every later
    token is fed as if generated, read at the depth its exit chooses; ``logprobs`` are then the
    per-token log-likelihoods of the text (``mean_loss`` its loss in nats per token)."""
    if context < 1 or any(len(row) <= context for row in sequences):
        raise LooplabError(f"every scored sequence needs more than its {context} context token(s)")
    forced = [row[context:] for row in sequences]
    prompts = [row[:context] for row in sequences]
    return generate(model, prompts, max(map(len, forced)), options, forced=forced)
