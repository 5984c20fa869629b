"""The config schema: one dataclass per section, every key with its default and its choices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

NORMS = ("layernorm", "rmsnorm", "simplenorm")
PLACEMENTS = ("pre", "post", "pre_sandwich", "post_sandwich")
PLACEMENT_ALIASES = {"sandwich_output": "pre_sandwich", "sandwich_residual": "post_sandwich"}
INJECTIONS = ("add", "concat", "none")
INIT_STATES = ("embed", "zeros", "noise")
INIT_SCALINGS = ("none", "sqrt_d")
INJECT_INITS = ("sum", "state", "input", "mix", "random")
POSITIONALS = ("rope", "nope", "learned")
ATTENTIONS = ("auto", "sdpa", "math")
PRECISIONS = ("fp32", "bf16")
JSRR_ESTIMATORS = ("none", "jvp", "vjp", "frobenius")
DEFAULT_FIXED_EXIT = 20  # the paper's training depth T_train
PRESETS = Path(__file__).resolve().parents[1] / "configs"  # the bundled configs, addressable by name


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

    ``attention_window`` w > 0 lets position i attend only to |i − j| ≤ w (causal:
    0 ≤ i − j ≤ w), so information moves at most w positions per layer and an
    answer that depends on the whole input needs depth that grows with its length.
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
    attention: str = "auto"
    attention_window: int = 0
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
    ``checkpoint_minutes`` > 0 also checkpoints when that much wall-clock time has passed since
    the last checkpoint (besides every ``checkpoint_every`` steps); 0 checkpoints by steps only.
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
    checkpoint_minutes: float = 0.0
    keep_checkpoints: int = 2
    backprop_loops: int = 0


@dataclass
class JsrrConfig:
    """Jacobian spectral-radius regulariser (docs/methods.md §6).

    ``estimator``: ``none``, ``jvp`` (‖Jv‖² by the linearised loop, the STARS paper's
    definition), ``vjp`` (‖Jᵀv‖², what the STARS code computes) or
    ``frobenius`` (Hutchinson estimate of ‖J‖²_F / D, as in DEQ). The loss is
    (1 − weight)·CE + weight·penalty, after ``warmup`` steps, on a step with
    probability ``prob``, with ``power_iters`` gradient-free power iterations first.
    ``rows`` > 0 computes the penalty on that many rows of the batch, drawn at
    random each step (0: every row): the same expected penalty, at a fraction of
    the cost, with more variance.
    """

    estimator: str = "none"
    weight: float = 0.1
    power_iters: int = 1
    warmup: int = 0
    prob: float = 1.0
    rows: int = 0


@dataclass
class StabilityConfig:
    jsrr: JsrrConfig = field(default_factory=JsrrConfig)


@dataclass
class EvalConfig:
    """One-unroll evaluation grid (docs/methods.md §5) and the test-time exits of docs/methods.md §4.

    ``fixed_exit`` is the K of the ``fixed`` exit (0: min(20, max_loops));
    ``convergence_eps`` the ε of the ``convergence`` exit. ``flip_from`` is the first K of the
    range [flip_from, max_loops − 1] the scalar flip rate averages over (1: every loop pair);
    runs compared on it should share it and max_loops. ``checkpoint_samples`` > 0
    evaluates that many samples per length at every checkpoint during training, for
    TensorBoard's ``eval/*`` curves (0: only the evaluation after training).
    """

    max_loops: int = 30
    samples: int = 256
    batch_size: int = 256
    fixed_exit: int = 0
    convergence_eps: float = 1e-3
    flip_from: int = 1
    checkpoint_samples: int = 0


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
