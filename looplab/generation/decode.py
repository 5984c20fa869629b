"""Autoregressive generation from a causal looped transformer, with a KV cache and a depth per token.

:func:`generate` takes a batch of prompts of different lengths (token ids), runs
them through the model once (the prefill, every prompt token to the exit's cap),
then one token per row per step. Each step runs the new token's loops until the
exit rule (:mod:`looplab.generation.exits`) stops it, reads the next-token
distribution from that state, and picks the next token (greedy, or sampled with
a temperature and top-k from a seeded generator). Rows whose token has stopped
leave the step, so a step costs the sum of its tokens' depths, not the batch
times the deepest. The cache policy (:mod:`looplab.generation.cache`) decides
which earlier keys and values a token reads; ``none`` recomputes the whole
sequence at every step instead (the reference the cached paths are tested
against; fixed depth only).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from looplab.errors import LooplabError
from looplab.generation.budget import check_budget
from looplab.generation.cache import POLICIES
from looplab.generation.decoder import Decoder
from looplab.generation.depthwise import DepthwiseDecoder, check_depthwise
from looplab.generation.exits import MAX_LOOPS, GenerationExit
from looplab.generation.sampling import Generation, Sampling, choose, ended
from looplab.generation.views import decodable
from looplab.generation.wavefront import WavefrontDecoder, check_wavefront
from looplab.lm.native import NativeLoop
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model import LoopedTransformer
from looplab.tasks.base import PAD

__all__ = ["Generation", "Sampling", "generate", "score", "GREEDY", "FIXED_EXIT"]


#: how a step's rows share core calls: all at one token (``step``), each at its own loop and token (``depth``),
#: or many positions of each row at once, each at its own loop (``wavefront``)
BATCHING = ("step", "depth", "wavefront")
#: the defaults of :func:`generate`: greedy decoding at a fixed 4 loops
GREEDY = Sampling()
FIXED_EXIT = GenerationExit()


@torch.no_grad()
def generate(
    model: LoopedTransformer | RetrofittedLoop | NativeLoop,
    prompts: list[list[int]],
    max_new_tokens: int,
    exit_rule: GenerationExit = FIXED_EXIT,
    cache: str = "per_loop",
    sampling: Sampling = GREEDY,
    finished: Callable[[list[int]], bool] | None = None,
    keep_loops: int = 2,
    forced: list[list[int]] | None = None,
    sources: list[str] | None = None,
    batching: str = "step",
    max_batch: int | None = None,
    front: int | None = None,
    read_only_exit: bool = False,
) -> Generation:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a causal looplab model, a retrofitted pretrained LM (:mod:`looplab.generation.retrofit`) or a
            native looped LM's adapter (:mod:`looplab.generation.native`).
        prompts: token ids per row (each non-empty; the task's start token first, as in training).
        exit_rule: the depth of each new token (``fixed``: ``exit_rule.loops`` for every token).
        cache: ``per_loop``, ``shared``, ``last_m`` (each token's last ``keep_loops`` loops) or
            ``none`` (recompute every step; fixed exit only).
        finished: called with a row's generated ids after each token; True ends that row.
        forced: the tokens each row takes instead of picking one (teacher forcing, for
            :func:`score`); a row ends with its forced tokens.
        sources: where each prompt came from (``prompts.txt line 3``), for the error that refuses one
            too long to continue (:mod:`looplab.generation.budget`; default: its index).
        batching: ``step`` (every row's token of a step runs before the next step) or ``depth`` (each
            core call advances every running row by one loop of its own token: :mod:`looplab.generation.depthwise`;
            ``per_loop`` cache only).
        max_batch: with ``depth`` batching, decode at most this many prompts at once; the others wait, and each
            takes the row of the next prompt to finish (prefilled there while the other rows go on).
        front: with ``wavefront`` batching (:mod:`looplab.generation.wavefront`; greedy, no coda), the positions
            of a row in flight at once (default: the exit's cap).
        read_only_exit: every token runs every loop to the cap and is only *read* at its exit's loop (Ouro's
            own forward: no compute saved); by default a token that exits stops computing, and later tokens
            read its keys and values as the cache policy says (step batching only).
    """
    model = decodable(model, gated=exit_rule.needs_gate)
    if exit_rule.needs_gate and not getattr(model, "gated", False):
        raise LooplabError(
            f"the {exit_rule.name} exit reads a learned exit gate, which this model lacks (Ouro has one)"
        )
    if read_only_exit and (batching != "step" or cache == "none"):
        raise LooplabError("a read-only exit runs every token to the cap: it needs --batching step and a KV cache")
    if batching not in BATCHING:
        raise LooplabError(f"unknown batching {batching!r}; valid choices: {', '.join(BATCHING)}")
    if batching == "depth":
        check_depthwise(model, cache)
    if batching == "wavefront":
        front = exit_rule.loops if front is None else front
        check_wavefront(model, cache, sampling, front)
        if forced is not None:
            raise LooplabError("wavefront decoding guesses its tokens; teacher-forced scoring: use --batching step")
    elif front is not None:
        raise LooplabError("--front sets the positions in flight per row: it needs --batching wavefront")
    if max_batch is not None:
        if batching != "depth":
            raise LooplabError("--max-batch lets waiting prompts take finished rows: it needs --batching depth")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise LooplabError(f"--max-batch must be a positive integer, got {max_batch!r}")
    _check(model, prompts, max_new_tokens, exit_rule, cache, keep_loops, forced, sources, max_batch)
    was_training = model.training
    model.eval()
    try:
        if cache == "none":
            return _generate_uncached(model, prompts, max_new_tokens, exit_rule.loops, sampling, finished, forced)
        if batching == "depth":
            decoder = DepthwiseDecoder(model, prompts, max_new_tokens, exit_rule, sampling, finished, forced, max_batch)
            return decoder.run()
        if batching == "wavefront":
            return WavefrontDecoder(model, prompts, max_new_tokens, exit_rule, sampling, finished, front).run()
        decoder = Decoder(
            model, prompts, max_new_tokens, exit_rule, cache, sampling, finished, keep_loops, forced,
            read_only=read_only_exit,
        )  # fmt: skip
        return decoder.run()
    finally:
        model.train(was_training)


def score(
    model: LoopedTransformer | RetrofittedLoop | NativeLoop,
    sequences: list[list[int]],
    exit_rule: GenerationExit = FIXED_EXIT,
    cache: str = "per_loop",
    context: int = 1,
    keep_loops: int = 2,
) -> Generation:
    """Teacher-forced decoding: each row's first ``context`` tokens are its prompt, and every later
    token is fed as if generated, read at the depth its exit chooses; ``logprobs`` are then the
    per-token log-likelihoods of the text (``mean_loss`` its loss in nats per token)."""
    if context < 1 or any(len(row) <= context for row in sequences):
        raise LooplabError(f"every scored sequence needs more than its {context} context token(s)")
    forced = [row[context:] for row in sequences]
    prompts = [row[:context] for row in sequences]
    return generate(model, prompts, max(map(len, forced)), exit_rule, cache, keep_loops=keep_loops, forced=forced)


def _check(
    model: LoopedTransformer,
    prompts,
    max_new_tokens,
    exit_rule: GenerationExit,
    cache: str,
    keep_loops,
    forced,
    sources,
    max_batch=None,
):
    cfg = model.cfg
    if not cfg.causal:
        raise LooplabError(
            "generation needs a causal model (model.causal = true): this one sees the tokens it predicts"
        )
    if cfg.recurrence != "standard":
        raise LooplabError(
            f"generation caches one key and value per core layer and loop; model.recurrence = {cfg.recurrence!r} "
            "runs the core several times a loop: valid choices: standard"
        )
    if cfg.init_state == "noise" and cfg.injection != "none":
        raise LooplabError("generation does not support init_state = 'noise' (each token would need its own draw)")
    if cache not in (*POLICIES, "none"):
        raise LooplabError(f"unknown KV cache policy {cache!r}; valid choices: {', '.join((*POLICIES, 'none'))}")
    policies = getattr(model, "policies", POLICIES)
    if cache not in (*policies, "none"):
        raise LooplabError(
            f"the {cache} cache is not defined for {type(model.loop).__name__} (its layers read earlier tokens "
            f"through convolutions too); valid choices: {', '.join((*policies, 'none'))}"
        )
    if cache == "last_m" and not 1 <= keep_loops <= MAX_LOOPS:
        raise LooplabError(f"the last_m cache keeps 1..{MAX_LOOPS} loops per token, got {keep_loops}")
    if forced is not None and (len(forced) != len(prompts) or any(len(row) == 0 for row in forced)):
        raise LooplabError(f"forced tokens must be given for each of the {len(prompts)} prompts, at least one each")
    if cache == "none" and exit_rule.adaptive:
        raise LooplabError("recomputing without a cache reads every token at one depth: use the fixed exit")
    if exit_rule.needs_head and exit_rule.halts is None:
        raise LooplabError(
            f"the {exit_rule.name} exit needs the run's halting head (a run trained with a halting schedule)"
        )
    if not prompts or any(len(p) == 0 for p in prompts):
        raise LooplabError("every prompt needs at least one token")
    vocab = model.head.out_features
    if any(not 0 <= token < vocab for row in (*prompts, *(forced or [])) for token in row):
        raise LooplabError(f"token ids must be in 0..{vocab - 1} (the model's vocabulary)")
    # rows held at once: every prompt, or max_batch rows as wide as the longest prompt
    lengths = [len(p) for p in prompts]
    if max_batch is not None and max_batch < len(prompts):
        held = sorted(sorted(range(len(prompts)), key=lengths.__getitem__)[-max_batch:])
        sources = [sources[i] if sources else f"prompts[{i}]" for i in held]
        lengths = [lengths[i] for i in held]
    check_budget(model, lengths, max_new_tokens, exit_rule.loops, cache, keep_loops, sources)


def _generate_uncached(model, prompts, max_new_tokens, loops, sampling, finished, forced) -> Generation:
    """Recompute every row's whole sequence at ``loops`` loops for every new token (the reference)."""
    device = model.head.weight.device
    generator = torch.Generator().manual_seed(sampling.seed)
    sequences = [list(p) for p in prompts]
    out = Generation(*([[] for _ in prompts] for _ in range(3)))
    live = list(range(len(prompts)))
    for step in range(max_new_tokens):
        lengths = torch.tensor([len(sequences[r]) for r in live], device=device)
        tokens = torch.full((len(live), int(lengths.max())), PAD, dtype=torch.long, device=device)
        for i, row in enumerate(live):
            tokens[i, : len(sequences[row])] = torch.tensor(sequences[row], device=device)
        valid = torch.arange(tokens.shape[1], device=device)[None, :] < lengths[:, None]
        logits = model(tokens, valid, loops)[torch.arange(len(live), device=device), lengths - 1]
        chosen = choose(logits, live, step, forced, sampling, generator)
        logprobs = logits.double().log_softmax(-1).gather(1, chosen[:, None]).squeeze(1).tolist()
        still = []
        for i, row in enumerate(live):
            token = int(chosen[i])
            sequences[row].append(token)
            out.record(row, token, loops, logprobs[i])
            if not ended(out.tokens[row], row, finished, forced):
                still.append(row)
        live = still
        if not live:
            break
    return out
