"""Checks of a config's values that need nothing but the schema: choices, ranges, numeric domains.

What depends on the registries (task and schedule names, a schedule's own
parameters) is checked by ``looplab.experiment.check_config``.
"""

from __future__ import annotations

import math

from looplab.config.schema import (
    ATTENTIONS,
    DEFAULT_FIXED_EXIT,
    INIT_SCALINGS,
    INIT_STATES,
    INJECT_INITS,
    INJECTIONS,
    JSRR_ESTIMATORS,
    NORMS,
    PLACEMENT_ALIASES,
    PLACEMENTS,
    POSITIONALS,
    PRECISIONS,
    Config,
)
from looplab.errors import LooplabError, choice_error

#: the most symbols a task's alphabet may have: each is a vocabulary entry, and the vocabulary is built as a list
MAX_ALPHABET = 2**16


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise LooplabError(message)


def validate(config: Config) -> None:
    """Check choices and ranges; normalise placement aliases in place.

    The [schedule] keys are the schedule's own parameters, checked by the schedule
    registry for the keys the chosen schedule reads.
    """
    m, t, tr, ev = config.model, config.task, config.train, config.eval
    m.placement = PLACEMENT_ALIASES.get(m.placement, m.placement)
    for where, value, choices in [
        ("model.norm", m.norm, NORMS),
        ("model.placement", m.placement, PLACEMENTS + tuple(PLACEMENT_ALIASES)),
        ("model.injection", m.injection, INJECTIONS),
        ("model.init_state", m.init_state, INIT_STATES),
        ("model.positional", m.positional, POSITIONALS),
        ("model.attention", m.attention, ATTENTIONS),
        ("model.init_scaling", m.init_scaling, INIT_SCALINGS),
        ("model.inject_init", m.inject_init, INJECT_INITS),
        ("run.precision", config.run.precision, PRECISIONS),
        ("stability.jsrr.estimator", config.stability.jsrr.estimator, JSRR_ESTIMATORS),
    ]:
        if value not in choices:
            raise choice_error(f"value for {where}:", value, choices)
    _require(
        m.d_model > 0 and m.n_heads > 0 and m.d_model % m.n_heads == 0,
        f"model.d_model ({m.d_model}) must be a positive multiple of model.n_heads ({m.n_heads})",
    )
    _require(m.positional != "rope" or (m.d_model // m.n_heads) % 2 == 0, "rope needs an even head dimension")
    _require(m.core_layers >= 1, "model.core_layers must be >= 1")
    _require(
        m.injection != "none" or m.init_state == "embed",
        f"model.init_state = {m.init_state!r} has no effect with injection = 'none': without injection the "
        "loop starts from e (h_0 = e), or the input would never enter it; use init_state = 'embed'",
    )
    _require(
        m.attention_window >= 0, f"model.attention_window must be >= 0 (0 = every position), got {m.attention_window}"
    )
    _require(min(m.prelude_layers, m.coda_layers, m.mlp_ratio - 1) >= 0, "layer counts must be >= 0, mlp_ratio >= 1")
    _require(1 <= t.train_min <= t.train_max, "task needs 1 <= train_min <= train_max")
    _require(
        2 <= t.alphabet <= MAX_ALPHABET,
        f"task.alphabet must be in [2, {MAX_ALPHABET}] (each symbol is a token of the vocabulary), got {t.alphabet}",
    )
    _require(len(t.eval_lengths) > 0 and min(t.eval_lengths) >= 1, "task.eval_lengths must be non-empty, all >= 1")
    jsrr = config.stability.jsrr
    _require(
        0 <= jsrr.weight <= 1 and 0 <= jsrr.prob <= 1 and min(jsrr.power_iters, jsrr.warmup, jsrr.rows) >= 0,
        "stability.jsrr needs weight and prob in [0, 1], power_iters >= 0, warmup >= 0 and rows >= 0 (0 = every row)",
    )
    _require(tr.backprop_loops >= 0, "train.backprop_loops must be >= 0 (0 = through every loop)")
    _require(
        tr.steps >= 0 and tr.batch_size >= 1, "train needs steps >= 0 (0 = keep the initialisation) and batch_size >= 1"
    )
    _require(
        tr.log_every >= 1 and tr.checkpoint_every >= 1 and tr.keep_checkpoints >= 1,
        "train.log_every, checkpoint_every and keep_checkpoints must be >= 1",
    )
    _require(
        min(ev.max_loops, ev.samples, ev.batch_size, ev.flip_from) >= 1
        and ev.fixed_exit >= 0
        and ev.convergence_eps > 0,
        "eval needs max_loops, samples, batch_size, flip_from >= 1, fixed_exit >= 0 and convergence_eps > 0",
    )
    _require(
        config.run.device == "cpu" or config.run.device.startswith("cuda"),
        f"run.device must be 'cpu' or 'cuda[:N]', got {config.run.device!r}",
    )
    for where, value, low, high in _number_domains(config):
        _require(
            _inside(value, low, high), f"{where} must be in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}, got {value!r}"
        )
    _require(
        ev.flip_from <= max(ev.max_loops - 1, 1),
        f"eval.flip_from ({ev.flip_from}) must be <= eval.max_loops - 1 ({ev.max_loops - 1}): the flip rate "
        "averages Pr[answer at K+1 != answer at K] over K = flip_from..max_loops-1",
    )
    _require(
        ev.fixed_exit <= ev.max_loops,
        f"eval.fixed_exit ({ev.fixed_exit}) must be <= eval.max_loops "
        f"({ev.max_loops}): it is read from the unroll (0 = min({DEFAULT_FIXED_EXIT}, max_loops))",
    )


def fixed_exit_depth(fixed_exit: int, max_loops: int) -> int:
    """The K of the ``fixed`` exit: ``eval.fixed_exit``, or min(20, max_loops) when it is 0 (automatic)."""
    return fixed_exit or min(DEFAULT_FIXED_EXIT, max_loops)


_INF = math.inf


def _number_domains(config: Config) -> list[tuple[str, float, tuple[str, float], tuple[str, float]]]:
    """(key, value, (bracket, low), (bracket, high)) for every number with a real domain; "(" / ")" are open."""
    m, tr, ev, run = config.model, config.train, config.eval, config.run
    positive, non_negative, unit, fraction = (
        (("(", 0.0), (")", _INF)),
        (("[", 0.0), (")", _INF)),
        (("[", 0.0), ("]", 1.0)),
        (("[", 0.0), (")", 1.0)),
    )
    return [
        (where, value, *domain)
        for where, value, domain in [
            ("train.lr", tr.lr, positive),
            ("train.grad_clip", tr.grad_clip, positive),
            ("train.min_lr_ratio", tr.min_lr_ratio, unit),
            ("train.beta1", tr.beta1, fraction),
            ("train.beta2", tr.beta2, fraction),
            ("train.weight_decay", tr.weight_decay, non_negative),
            ("train.warmup_steps", tr.warmup_steps, non_negative),
            ("train.checkpoint_minutes", tr.checkpoint_minutes, non_negative),
            ("model.rope_base", m.rope_base, positive),
            ("model.noise_std", m.noise_std, non_negative),
            ("model.max_len", m.max_len, positive),
            ("model.init_std", m.init_std, positive),
            ("model.embed_std", m.embed_std, positive),
            ("model.inject_gain", m.inject_gain, positive),
            ("eval.convergence_eps", ev.convergence_eps, positive),
            ("run.threads", run.threads, non_negative),
        ]
    ]


def _inside(value: float, low: tuple[str, float], high: tuple[str, float]) -> bool:
    """Whether ``value`` is finite and inside the interval; NaN and ±inf never are."""
    (low_bracket, low_value), (high_bracket, high_value) = low, high
    if not math.isfinite(value):
        return False
    above = value > low_value if low_bracket == "(" else value >= low_value
    below = value < high_value if high_bracket == ")" else value <= high_value
    return above and below
