"""What a generation may ask for, checked before any work: its new tokens and its prompts' lengths.

A generation holds at once, as a rough upper bound in the manner of :mod:`looplab.memory`: the keys and
values of every layer call for every slot (the longest prompt's W tokens plus N new ones per row; per
core layer, the loops the cache policy holds: one cache per loop under ``per_loop``, one under ``shared``,
``keep_loops`` under ``last_m``), the prefill's attention scores and mask over the prompts (B × H × W × W)
and its states.
Without a cache every step recomputes each row whole (B × H × S × S scores and [B, S, V] logits, S = W + N).
Positions end at the model's ``max_len`` (learned positions have no row past it; RoPE and relative
positions were trained within it, and the server and ``eval --window`` hold every model to it too). A
request over either bound is refused with the range that
fits; one that fits comfortably never is. The loop cap is bounded by the exit
(:data:`looplab.token_exits.MAX_LOOPS`).
"""

from __future__ import annotations

from numbers import Integral

from looplab.errors import LooplabError
from looplab.generation.cache import kv_shape
from looplab.generation.policies import NO_CACHE, POLICIES, cache_params
from looplab.memory import GIB, device_bytes
from looplab.plugins import run_entry
from looplab.token_exits import MAX_LOOPS

__all__ = ["generation_bytes", "check_budget"]


def generation_bytes(model, batch: int, width: int, new: int, loops: int, cache: str, params=None) -> int:
    """Bytes a generation of ``batch`` rows, prompts padded to ``width`` tokens and ``new`` tokens each, holds
    at ``loops`` loops under ``cache`` with its ``params`` (``model`` as the decoder reads it:
    ``views.decodable``)."""
    cfg = model.cfg
    elem = model.head.weight.element_size()
    heads, d, vocab = cfg.n_heads, cfg.d_model, model.head.out_features
    kv_heads, head_dim, _ = kv_shape(model)
    slots = width + new
    if cache == NO_CACHE:  # the whole sequence, every layer call's scores, states and every position's logits
        return elem * batch * slots * (3 * heads * slots + 16 * d + vocab) + 3 * batch * slots * slots
    policy, params = POLICIES[cache], cache_params(cache, params)
    core = run_entry("KV cache policy", cache, policy, policy.held_loops, params, loops)
    if isinstance(core, bool) or not isinstance(core, Integral) or not 1 <= core <= MAX_LOOPS:
        raise LooplabError(
            f"KV cache policy {cache!r} ({policy.origin}) says a token holds {core!r} loops of keys and values at "
            f"a cap of {loops}; held_loops returns an integer in 1..{MAX_LOOPS}"
        )
    calls = len(model.prelude) + len(model.coda) + core * len(model.core)
    keys_values = 2 * batch * kv_heads * slots * head_dim * calls
    prefill = batch * width * (3 * heads * width + 16 * d)  # scores, softmax and states of the prompts
    rows = (9 + policy.index_bytes(params) * len(model.core)) * batch * slots  # slots, a ring's loop indices
    return elem * (keys_values + prefill + 4 * batch * vocab) + 3 * batch * width * width + rows


def _largest(fits) -> int:
    """The largest n >= 0 with ``fits(n)`` (fits is monotone: true up to some n, false after; memory grows
    with n, so that n is finite)."""
    low, high = 0, 1
    while fits(high):
        low, high = high, 2 * high
    high -= 1
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def check_budget(
    model, lengths: list[int], new: int, loops: int, cache: str, params=None, sources: list[str] | None = None
) -> None:
    """Refuse a generation that cannot fit: a prompt too long to continue (named by ``sources``, else by its
    index), or a number of new tokens outside the range that fits, in one line with that range."""
    if isinstance(new, bool) or not isinstance(new, Integral):
        raise LooplabError(f"max new tokens must be an integer, got {new!r}")
    cfg = model.cfg
    device = str(model.head.weight.device)
    available = device_bytes(device)
    batch, width = len(lengths), max(lengths)

    def fits(prompt: int, count: int) -> bool:
        if prompt + count > cfg.max_len:
            return False
        return generation_bytes(model, batch, prompt, count, loops, cache, params) <= available

    def why(prompt: int, count: int) -> str:
        if prompt + count > cfg.max_len:
            kind = "learned positions" if cfg.positional == "learned" else "the model's positions"
            return f"{kind} end at {cfg.max_len} (max_len)"
        needed = generation_bytes(model, batch, prompt, count, loops, cache, params)
        return (
            f"{batch} row(s) at {loops} loops with the {cache} cache need an estimated {needed / GIB:,.1f} GiB, "
            f"more than the {available / GIB:,.1f} GiB of {device}"
        )

    if not fits(width, 1):
        longest = lengths.index(width)
        name = sources[longest] if sources else f"prompts[{longest}]"
        room = _largest(lambda prompt: fits(prompt, max(new, 1)))
        raise LooplabError(
            f"{name}: its {width} tokens leave no room for new ones ({why(width, 1)}): prompts of at most "
            f"{room} tokens fit with {max(new, 1)} new"
        )
    if new < 1 or not fits(width, new):
        most = _largest(lambda count: fits(width, count))
        reason = f" ({why(width, new)})" if new >= 1 else ""
        raise LooplabError(
            f"max new tokens must be in 1..{most} for prompts of up to {width} tokens{reason}, got {new}"
        )
