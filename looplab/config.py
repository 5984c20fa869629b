"""Run configuration: typed dataclasses, TOML load/save, ``section.key=value`` overrides.

A config file has the sections ``[task]``, ``[model]``, ``[schedule]``,
``[train]``, ``[eval]`` and ``[run]``; every key is optional and defaults to the
field value below. Unknown sections or keys, wrongly typed values and values
outside a key's choices raise :class:`LooplabError` naming the valid options.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import tomli_w

from looplab.errors import LooplabError, choice_error

NORMS = ("layernorm", "rmsnorm", "simplenorm")
PLACEMENTS = ("pre", "post", "pre_sandwich", "post_sandwich")
PLACEMENT_ALIASES = {"sandwich_output": "pre_sandwich", "sandwich_residual": "post_sandwich"}
INJECTIONS = ("add", "concat", "none")
INIT_STATES = ("embed", "zeros", "noise")
INIT_SCALINGS = ("none", "sqrt_d")
INJECT_INITS = ("sum", "state", "input", "mix", "random")
POSITIONALS = ("rope", "nope", "learned")
ATTENTIONS = ("sdpa", "math")
PRECISIONS = ("fp32", "bf16")
ENTROPY_MODES = ("exact", "sampled")
JSRR_ESTIMATORS = ("none", "jvp", "vjp", "frobenius")
DEFAULT_FIXED_EXIT = 20  # the paper's training depth T_train
PRESETS = Path(__file__).resolve().parent / "configs"  # the bundled configs, addressable by name


@dataclass
class TaskConfig:
    """Which task, and the length split: train on [train_min, train_max], OOD above."""

    name: str = "binary_addition"
    alphabet: int = 8
    train_min: int = 1
    train_max: int = 12
    eval_lengths: list[int] = field(default_factory=lambda: [4, 8, 12, 16, 20, 24])


@dataclass
class ModelConfig:
    """The looped transformer (docs/methods.md §1).

    Initialisation: every Linear weight ~ N(0, init_std²), or N(0, init_std²/d) with
    ``init_scaling = "sqrt_d"`` (biases 0); token and position embeddings ~
    N(0, embed_std²). The concat injection's W_I in W_I [e; h] starts as ``sum``
    [I | I] (equal to ``add``), ``state`` [0 | I] (ignores e), ``input`` [I | 0]
    (ignores h), ``mix`` [I/2 | I/2] (the mean of e and h) or ``random``
    N(0, inject_gain²/d) per entry.
    """

    d_model: int = 64
    n_heads: int = 4
    mlp_ratio: int = 4
    prelude_layers: int = 0
    core_layers: int = 2
    coda_layers: int = 0
    injection: str = "add"
    init_state: str = "embed"
    noise_std: float = 1.0
    norm: str = "layernorm"
    placement: str = "pre"
    core_out_norm: bool = False
    positional: str = "rope"
    causal: bool = False
    attention: str = "sdpa"
    max_len: int = 512
    rope_base: float = 10000.0
    init_std: float = 0.02
    init_scaling: str = "none"
    embed_std: float = 0.02
    inject_init: str = "sum"
    inject_gain: float = 0.25


@dataclass
class ScheduleConfig:
    """Training-depth schedule (docs/methods.md §3, §4).

    ``depth`` is the constant c, ``window`` the w of the window schedules and
    ``t_max`` the clip bound, which is also T_max of the halting schedules.
    Learned halting: REINFORCE's entropy bonus (weight and ``exact`` or
    ``sampled`` estimator) and baseline momentum, PonderNet's geometric prior
    rate λ_p and KL weight β, and the halting head's learning rate as a
    multiple of the model's. Random loop sampling: ``lognormal`` uses μ, σ and
    the clip range [lo, hi]; ``poisson_lognormal`` uses ``mean_depth`` r̄, σ and
    [lo, hi]; either draws one depth per batch (``per_batch``, as STARS) or per row.
    """

    name: str = "matched"
    depth: int = 20
    window: int = 5
    t_max: int = 20
    entropy_weight: float = 0.001
    entropy_mode: str = "sampled"
    baseline_momentum: float = 0.9
    ponder_prior: float = 0.2
    ponder_beta: float = 0.01
    lr_scale: float = 1.0
    mu: float = 2.0
    sigma: float = 0.7
    mean_depth: float = 8.0
    lo: int = 1
    hi: int = 100
    per_batch: bool = True


@dataclass
class TrainConfig:
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio * lr``.

    ``steps = 0`` trains nothing: the run's one checkpoint is the seeded initialisation.
    ``backprop_loops`` = k > 0 backpropagates through each row's last k loops only.
    """

    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.0
    warmup_steps: int = 100
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    backprop_loops: int = 0


@dataclass
class JsrrConfig:
    """Jacobian spectral-radius regulariser (docs/methods.md §6).

    ``estimator``: ``none``, ``jvp`` (‖Jv‖², forward mode, the STARS paper's
    definition), ``vjp`` (‖Jᵀv‖², what the STARS code computes) or
    ``frobenius`` (Hutchinson estimate of ‖J‖²_F / D, as in DEQ). The loss is
    (1 − weight)·CE + weight·penalty, after ``warmup`` steps, on a step with
    probability ``prob``, with ``power_iters`` gradient-free power iterations first.
    """

    estimator: str = "none"
    weight: float = 0.1
    power_iters: int = 1
    warmup: int = 0
    prob: float = 1.0


@dataclass
class StabilityConfig:
    jsrr: JsrrConfig = field(default_factory=JsrrConfig)


@dataclass
class EvalConfig:
    """One-unroll evaluation grid (docs/methods.md §5) and the test-time exits of docs/methods.md §4.

    ``fixed_exit`` is the K of the ``fixed`` exit (0: min(20, max_loops));
    ``convergence_eps`` the ε of the ``convergence`` exit.
    """

    max_loops: int = 30
    samples: int = 256
    batch_size: int = 256
    fixed_exit: int = 0
    convergence_eps: float = 1e-3


@dataclass
class RunConfig:
    """Seed, device and precision. ``bf16`` autocasts the forward pass (meant for CUDA)."""

    seed: int = 0
    device: str = "cpu"
    precision: str = "fp32"
    threads: int = 0


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def _check_type(where: str, value: Any, annotation: Any) -> Any:
    """Return ``value`` coerced to ``annotation`` or raise a one-line error."""
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        if not isinstance(value, list):
            raise LooplabError(f"{where} must be a list of {item.__name__}, got {value!r}")
        return [_check_type(where, v, item) for v in value]
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, bool) or not isinstance(value, annotation):
        raise LooplabError(f"{where} must be {annotation.__name__}, got {value!r}")
    return value


def _fill(target: Any, values: dict[str, Any], where: str) -> None:
    """Set the fields of dataclass ``target`` from ``values``, recursing into sub-tables."""
    hints = get_type_hints(type(target))
    for key, value in values.items():
        name = f"{where}.{key}" if where else key
        if key not in hints:
            raise choice_error(f"key in [{where}]" if where else "config section", key, hints)
        if dataclasses.is_dataclass(hints[key]):
            if not isinstance(value, dict):
                raise LooplabError(f"config section [{name}] must be a table, got {value!r}")
            _fill(getattr(target, key), value, name)
        else:
            setattr(target, key, _check_type(name, value, hints[key]))


def from_dict(data: dict[str, Any]) -> Config:
    """Build a validated :class:`Config` from nested ``{section: {key: value}}``."""
    config = Config()
    _fill(config, data, "")
    validate(config)
    return config


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """Parse ``section.key=value`` (or ``section.sub.key=value``).

    Returns:
        the key path and the value, read as TOML or else as a bare string.
    """
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise LooplabError(f"override {text!r} must look like section.key=value")
    dotted, raw = text.split("=", 1)
    path = tuple(part.strip() for part in dotted.split("."))
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def resolve_preset(path: str | Path) -> Path:
    """``path`` itself when it exists, else the bundled preset of that name, with or without ``.toml``
    (``demo``, ``stopping-small/binary_addition-fixed``, ``sweeps/stars-small``); else ``path`` unchanged."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    preset = PRESETS / (path if path.suffix == ".toml" else path.with_name(path.name + ".toml"))
    return preset if preset.is_file() else path


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The tables of the TOML file at ``path`` (or of the bundled preset of that name); a missing or
    malformed file is a one-line error naming ``what``."""
    path = resolve_preset(path)
    if path.is_dir():
        raise LooplabError(f"{what} {path} is a directory, not a TOML file")
    if not path.is_file():
        folders = sorted(p.name for p in PRESETS.iterdir() if p.is_dir())
        raise LooplabError(f"{what} not found: {path} (neither a file nor a bundled preset; presets: demo, "
                           f"{', '.join(f'{folder}/…' for folder in folders)})")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise LooplabError(f"{what} {path} is not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise LooplabError(f"{what} {path} is not UTF-8 text") from None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a TOML config (or start from defaults when ``path`` is None), then apply overrides."""
    data: dict[str, Any] = {} if path is None else read_toml(path, "config file")
    for text in overrides:
        keys, value = parse_override(text)
        table = data
        for depth, key in enumerate(keys[:-1]):
            table = table.setdefault(key, {})
            if not isinstance(table, dict):
                raise LooplabError(f"config section [{'.'.join(keys[:depth + 1])}] must be a table")
        table[keys[-1]] = value
    return from_dict(data)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise LooplabError(message)


def validate(config: Config) -> None:
    """Check choices and ranges; normalise placement aliases in place."""
    from looplab.tasks import TASKS
    from looplab.train.schedules import SCHEDULES, DepthRule

    m, t, s, tr, ev = config.model, config.task, config.schedule, config.train, config.eval
    m.placement = PLACEMENT_ALIASES.get(m.placement, m.placement)
    for where, value, choices in [
        ("task.name", t.name, TASKS),
        ("schedule.name", s.name, SCHEDULES),
        ("model.norm", m.norm, NORMS),
        ("model.placement", m.placement, PLACEMENTS + tuple(PLACEMENT_ALIASES)),
        ("model.injection", m.injection, INJECTIONS),
        ("model.init_state", m.init_state, INIT_STATES),
        ("model.positional", m.positional, POSITIONALS),
        ("model.attention", m.attention, ATTENTIONS),
        ("model.init_scaling", m.init_scaling, INIT_SCALINGS),
        ("model.inject_init", m.inject_init, INJECT_INITS),
        ("run.precision", config.run.precision, PRECISIONS),
        ("schedule.entropy_mode", s.entropy_mode, ENTROPY_MODES),
        ("stability.jsrr.estimator", config.stability.jsrr.estimator, JSRR_ESTIMATORS),
    ]:
        if value not in choices:
            raise choice_error(f"value for {where}:", value, choices)
    _require(m.d_model > 0 and m.n_heads > 0 and m.d_model % m.n_heads == 0,
             f"model.d_model ({m.d_model}) must be a positive multiple of model.n_heads ({m.n_heads})")
    _require(m.positional != "rope" or (m.d_model // m.n_heads) % 2 == 0, "rope needs an even head dimension")
    _require(m.core_layers >= 1, "model.core_layers must be >= 1")
    _require(min(m.prelude_layers, m.coda_layers, m.mlp_ratio - 1) >= 0, "layer counts must be >= 0, mlp_ratio >= 1")
    _require(1 <= t.train_min <= t.train_max, "task needs 1 <= train_min <= train_max")
    _require(len(t.eval_lengths) > 0 and min(t.eval_lengths) >= 1, "task.eval_lengths must be non-empty, all >= 1")
    _require(s.depth >= 1 and s.window >= 0 and s.t_max >= 1, "schedule needs depth >= 1, window >= 0, t_max >= 1")
    _require(0 < s.ponder_prior < 1 and 0 <= s.baseline_momentum < 1,
             "schedule needs 0 < ponder_prior < 1 and 0 <= baseline_momentum < 1")
    _require(min(s.entropy_weight, s.ponder_beta) >= 0 and s.lr_scale > 0,
             "schedule needs entropy_weight, ponder_beta >= 0 and lr_scale > 0")
    _require(1 <= s.lo <= s.hi and s.sigma >= 0 and s.mean_depth >= 1,
             "schedule needs 1 <= lo <= hi, sigma >= 0 and mean_depth >= 1")
    jsrr = config.stability.jsrr
    _require(0 <= jsrr.weight <= 1 and 0 <= jsrr.prob <= 1 and jsrr.power_iters >= 0 and jsrr.warmup >= 0,
             "stability.jsrr needs weight and prob in [0, 1], power_iters >= 0 and warmup >= 0")
    _require(tr.backprop_loops >= 0, "train.backprop_loops must be >= 0 (0 = through every loop)")
    _require(tr.backprop_loops == 0 or issubclass(SCHEDULES[s.name], DepthRule),
             f"train.backprop_loops needs a rule schedule; {s.name!r} learns its depths")
    _require(tr.steps >= 0 and tr.batch_size >= 1,
             "train needs steps >= 0 (0 = keep the initialisation) and batch_size >= 1")
    _require(tr.log_every >= 1 and tr.checkpoint_every >= 1 and tr.keep_checkpoints >= 1,
             "train.log_every, checkpoint_every and keep_checkpoints must be >= 1")
    _require(min(ev.max_loops, ev.samples, ev.batch_size) >= 1 and ev.fixed_exit >= 0 and ev.convergence_eps > 0,
             "eval needs max_loops, samples, batch_size >= 1, fixed_exit >= 0 and convergence_eps > 0")
    _require(config.run.device == "cpu" or config.run.device.startswith("cuda"),
             f"run.device must be 'cpu' or 'cuda[:N]', got {config.run.device!r}")
    for where, value, low, high in _number_domains(config):
        _require(_inside(value, low, high), f"{where} must be in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}, got {value!r}")
    _require(ev.fixed_exit <= ev.max_loops, f"eval.fixed_exit ({ev.fixed_exit}) must be <= eval.max_loops "
             f"({ev.max_loops}): it is read from the unroll (0 = min({DEFAULT_FIXED_EXIT}, max_loops))")


def fixed_exit_depth(fixed_exit: int, max_loops: int) -> int:
    """The K of the ``fixed`` exit: ``eval.fixed_exit``, or min(20, max_loops) when it is 0 (automatic)."""
    return fixed_exit or min(DEFAULT_FIXED_EXIT, max_loops)


_INF = math.inf


def _number_domains(config: Config) -> list[tuple[str, float, tuple[str, float], tuple[str, float]]]:
    """(key, value, (bracket, low), (bracket, high)) for every number with a real domain; "(" / ")" are open."""
    m, s, tr, ev, run = config.model, config.schedule, config.train, config.eval, config.run
    positive, non_negative, unit, fraction = (("(", 0.0), (")", _INF)), (("[", 0.0), (")", _INF)), \
        (("[", 0.0), ("]", 1.0)), (("[", 0.0), (")", 1.0))
    return [(where, value, *domain) for where, value, domain in [
        ("train.lr", tr.lr, positive), ("train.grad_clip", tr.grad_clip, positive),
        ("train.min_lr_ratio", tr.min_lr_ratio, unit), ("train.beta1", tr.beta1, fraction),
        ("train.beta2", tr.beta2, fraction), ("train.weight_decay", tr.weight_decay, non_negative),
        ("train.warmup_steps", tr.warmup_steps, non_negative), ("model.rope_base", m.rope_base, positive),
        ("model.noise_std", m.noise_std, non_negative), ("model.max_len", m.max_len, positive),
        ("model.init_std", m.init_std, positive), ("model.embed_std", m.embed_std, positive),
        ("model.inject_gain", m.inject_gain, positive),
        ("schedule.mu", s.mu, (("(", -_INF), (")", _INF))), ("schedule.sigma", s.sigma, non_negative),
        ("eval.convergence_eps", ev.convergence_eps, positive), ("run.threads", run.threads, non_negative),
    ]]


def _inside(value: float, low: tuple[str, float], high: tuple[str, float]) -> bool:
    """Whether ``value`` is finite and inside the interval; NaN and ±inf never are."""
    (low_bracket, low_value), (high_bracket, high_value) = low, high
    if not math.isfinite(value):
        return False
    above = value > low_value if low_bracket == "(" else value >= low_value
    below = value < high_value if high_bracket == ")" else value <= high_value
    return above and below
