"""The config schema: one dataclass per section, every key with its default and its choices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from looplab.params import FRACTION, NON_NEGATIVE, POSITIVE, UNIT, Domain, at_least, one_of, param

NORMS = ("layernorm", "rmsnorm", "simplenorm")
PLACEMENT_ALIASES = {"sandwich_output": "pre_sandwich", "sandwich_residual": "post_sandwich"}
INJECTIONS = ("add", "concat", "contractive", "none")
RECURRENCES = ("standard", "trm")
INIT_STATES = ("embed", "zeros", "noise")
INIT_SCALINGS = ("none", "sqrt_d")
INJECT_INITS = ("sum", "state", "input", "mix", "random")
POSITIONALS = ("rope", "nope", "learned")
ATTENTIONS = ("auto", "sdpa", "math")
PRECISIONS = ("fp32", "bf16")
PRETRAINED_DTYPES = ("float32", "bfloat16")
ADAPTERS = ("none", "lora")  # train.adapter (looplab.lm.adapters)
#: keys written into a config's TOML only when set (section → key → default): the configs written before
#: them keep their text, and their run and sweep ids
OPTIONAL_KEYS = {
    "task": {"text_file": ""},
    "model": {"pretrained": "", "pretrained_dtype": "float32", "pretrained_tokenizer": ""},
    "train": {"adapter": "none", "adapter_rank": 8, "adapter_alpha": 16.0, "adapter_targets": []},
}
DEFAULT_SAMPLES = 256  # evaluation samples per length
#: the most symbols a task's alphabet may have: each is a vocabulary entry, and the vocabulary is built as a list
MAX_ALPHABET = 2**16
PRESETS = Path(__file__).resolve().parents[1] / "configs"  # the bundled configs, addressable by name


@dataclass
class TaskConfig:
    """Which task, and the length split: train on [train_min, train_max], OOD above.

    ``pool`` names a file from ``looplab pool`` (made absolute when the config is read): training draws
    the instances of its sizes from it; evaluation always draws fresh ones. ``text_file`` (task
    ``text`` only; made absolute too) is the text its windows are cut from, for training and evaluation.
    """

    name: str = "binary_addition"
    alphabet: int = param(8, Domain(2, MAX_ALPHABET), "each symbol is a token of the vocabulary")
    train_min: int = param(1, at_least(1))
    train_max: int = param(12, at_least(1))
    eval_lengths: list[int] = param([4, 8, 12, 16, 20, 24])
    pool: str = param("", doc="a pre-drawn training pool (looplab pool); empty: every instance drawn live")
    text_file: str = param("", doc="task 'text': a UTF-8 file read instead of the KJV corpus; empty: KJV")


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

    ``recurrence = "trm"`` makes one loop TRM's latent recursion: the state is the
    pair (y, z), z is updated ``latent_steps`` times from e + y + z and then y from
    y + z, every update by the same core (docs/methods.md §1.1).

    ``pretrained`` names a model dir instead (``looplab.lm.model_dir``: a native looped LM of
    transformers, or a retrofit written by ``looplab retrofit``; made absolute when the config is
    read): the run fine-tunes its looped adapter, loaded in ``pretrained_dtype``, on task ``text``
    (the dir's own tokenizer, or the one in ``pretrained_tokenizer`` where the dir holds none). The dir
    is the architecture, so every other key here keeps its default.
    """

    d_model: int = param(64, at_least(1))
    n_heads: int = param(4, at_least(1))
    mlp_ratio: int = param(4, at_least(1))
    prelude_layers: int = param(0, at_least(0))
    core_layers: int = param(2, at_least(1))
    coda_layers: int = param(0, at_least(0))
    injection: str = param("add", one_of(*INJECTIONS))
    recurrence: str = param("standard", one_of(*RECURRENCES), "trm: TRM's two carried states per loop")
    latent_steps: int = param(6, at_least(1), "trm: updates of the latent z per loop (TRM's n)")
    init_state: str = param("embed", one_of(*INIT_STATES))
    noise_std: float = param(1.0, NON_NEGATIVE)
    norm: str = param("layernorm", one_of(*NORMS))
    placement: str = param("pre", None, "a registered placement (looplab.model.placements)")
    core_out_norm: bool = False
    positional: str = param("rope", one_of(*POSITIONALS))
    causal: bool = False
    attention: str = param("auto", one_of(*ATTENTIONS))
    attention_window: int = param(0, at_least(0), "0: every position")
    max_len: int = param(512, POSITIVE)
    rope_base: float = param(10000.0, POSITIVE)
    init_std: float = param(0.02, POSITIVE)
    init_scaling: str = param("none", one_of(*INIT_SCALINGS))
    embed_std: float = param(0.02, POSITIVE)
    inject_init: str = param("sum", one_of(*INJECT_INITS))
    inject_gain: float = param(0.25, POSITIVE)
    pretrained: str = param("", doc="a model dir (config.json + safetensors + tokenizer) to fine-tune; empty: build")
    pretrained_dtype: str = param("float32", one_of(*PRETRAINED_DTYPES), "the weights of model.pretrained")
    pretrained_tokenizer: str = param("", doc="the folder of model.pretrained's tokenizer where it holds none")


@dataclass(init=False)
class ScheduleConfig:
    """[schedule]: the training-depth schedule's name and the values of its own parameters.

    Each schedule declares its parameters, their defaults and their domains itself
    (its ``Params``, ``looplab.schedules``); this section keeps the values the file
    and the overrides set, and ``looplab.experiment.check_config`` checks them
    against the chosen schedule's declaration and fills in its defaults.
    ``ScheduleConfig(name="fixed", depth=4)`` reads as the TOML table would.
    """

    name: str
    params: dict[str, Any]

    def __init__(self, name: str = "matched", **params: Any):
        self.name = name
        self.params = params

    def to_dict(self) -> dict[str, Any]:
        """The TOML table: ``name``, then the parameters."""
        return {"name": self.name, **self.params}


@dataclass
class TrainConfig:
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio * lr``.

    ``steps = 0`` trains nothing: the run's one checkpoint is the seeded initialisation.
    ``backprop_loops`` = k > 0 backpropagates through each row's last k loops only.
    ``segment_loops`` = k > 0 trains under deep supervision: each row's unroll cut into segments
    of k loops, a loss at every segment's end, the state detached between segments
    (``backprop_loops`` then counts within each segment).
    ``shared_view_weight`` w > 0 trains in the ``shared`` KV cache's view as well: the loss is
    (1 − w) × the ordinary unroll's + w × the shared view's (:mod:`looplab.model.shared_view`, two
    unrolls a step).
    ``checkpoint_minutes`` > 0 also checkpoints when that much wall-clock time has passed since
    the last checkpoint (besides every ``checkpoint_every`` steps); 0 checkpoints by steps only.
    ``checkpoint_loops`` keeps no loop's activations for the backward pass but its input, and recomputes
    them there (gradient checkpointing per loop: activation memory of one loop, about one more forward).
    ``adapter = "lora"`` fine-tunes a model dir (``model.pretrained``) through low-rank adapters of rank
    ``adapter_rank`` and scale ``adapter_alpha`` / rank beside the linear layers ``adapter_targets`` names
    (empty: every one but the output head), its own weights frozen (:mod:`looplab.lm.adapters`).
    """

    steps: int = param(2000, at_least(0), "0: keep the initialisation")
    batch_size: int = param(64, at_least(1))
    lr: float = param(1e-3, POSITIVE)
    min_lr_ratio: float = param(0.0, UNIT)
    warmup_steps: int = param(100, NON_NEGATIVE)
    weight_decay: float = param(0.01, NON_NEGATIVE)
    beta1: float = param(0.9, FRACTION)
    beta2: float = param(0.999, FRACTION)
    grad_clip: float = param(1.0, POSITIVE)
    log_every: int = param(50, at_least(1))
    checkpoint_every: int = param(500, at_least(1))
    checkpoint_minutes: float = param(0.0, NON_NEGATIVE, "0: checkpoint by steps only")
    keep_checkpoints: int = param(2, at_least(1))
    backprop_loops: int = param(0, at_least(0), "0: through every loop")
    segment_loops: int = param(0, at_least(0), "0: no deep supervision")
    shared_view_weight: float = param(0.0, UNIT, "0: the ordinary unroll only")
    checkpoint_loops: bool = param(
        False, doc="recompute each loop's activations in the backward pass (memory: one loop)"
    )
    init_from: str = param(
        "", doc="a run dir whose latest checkpoint's model weights start this run (fine-tuning); empty: fresh"
    )
    adapter: str = param("none", one_of(*ADAPTERS), "a model dir's fine-tune: none trains every weight, lora adapters")
    adapter_rank: int = param(8, at_least(1), "the adapters' rank r")
    adapter_alpha: float = param(16.0, POSITIVE, "the adapters' scale is alpha / r")
    adapter_targets: list[str] = param([], doc="linear layers by name suffix (empty: all but the output head)")


@dataclass
class EvalConfig:
    """One-unroll evaluation grid (docs/methods.md §5) and the test-time exits of docs/methods.md §4.

    ``exits`` holds one table per test-time exit (``[eval.exits.fixed] depth = 8``), each
    declared by its exit (``looplab.exits``) and completed by ``check_config``; the keys of
    earlier releases, ``fixed_exit`` and ``convergence_eps``, are read into ``exits.fixed.depth``
    and ``exits.convergence.eps`` (:data:`LEGACY_EXIT_KEYS`). ``flip_from`` is the first K of the
    range [flip_from, max_loops − 1] the scalar flip rate averages over (1: every loop pair);
    runs compared on it should share it and max_loops. ``checkpoint_samples`` > 0
    evaluates that many samples per length at every checkpoint during training, for
    TensorBoard's ``eval/*`` curves (0: only the evaluation after training).
    """

    max_loops: int = param(30, at_least(1))
    samples: int = param(DEFAULT_SAMPLES, at_least(1))
    batch_size: int = param(256, at_least(1))
    flip_from: int = param(1, at_least(1))
    checkpoint_samples: int = param(0, at_least(0))
    exits: dict[str, dict[str, Any]] = param({}, doc="[eval.exits.NAME]: each exit's own parameters")


#: ``[eval]`` keys of earlier releases → (exit, its parameter) they now set
LEGACY_EXIT_KEYS = {"fixed_exit": ("fixed", "depth"), "convergence_eps": ("convergence", "eps")}


@dataclass
class GenerateConfig:
    """``looplab generate``'s settings a run keeps: ``exits`` holds one table per generation exit
    (``[generate.exits.kl] eps = 0.01``), each declared by its exit (``looplab.token_exits``) and checked
    by ``check_config``, as ``[eval.exits]`` is for the test-time exits, but holding only the keys set (the
    run never reads them; ``looplab generate`` fills the rest from the declaration when it runs);
    ``--exit-param KEY=VALUE`` overrides a key for one command."""

    exits: dict[str, dict[str, Any]] = param({}, doc="[generate.exits.NAME]: each generation exit's own parameters")


@dataclass
class RunConfig:
    """Seed, device, precision and plugins. ``bf16`` autocasts the forward pass (meant for CUDA).

    ``plugins``: modules (``my_pkg.my_schedule``) or Python files (``path/to/my_exit.py``) imported
    before the rest of the config is read, so the schedules, regularisers, exits, metrics and tasks
    they register can be named in it (``looplab.plugins``).
    """

    seed: int = 0
    device: str = "cpu"
    precision: str = param("fp32", one_of(*PRECISIONS))
    threads: int = param(0, NON_NEGATIVE, "0: torch's default")
    plugins: list[str] = param([])


@dataclass
class Config:
    """A whole run's configuration.

    ``stability`` holds one table per regulariser (``[stability.jsrr]``), each declared by
    its regulariser (``looplab.regularisers``) and completed by ``check_config`` like ``schedule``.
    """

    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    stability: dict[str, dict[str, Any]] = field(default_factory=dict)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The nested TOML tables, sections in file order."""
        plain = {
            section: _set_keys(section, dataclasses.asdict(getattr(self, section))) for section in ("task", "model")
        }
        plain["schedule"] = self.schedule.to_dict()
        plain.update({section: dataclasses.asdict(getattr(self, section)) for section in ("train", "eval")})
        if self.generate.exits:  # written only when set: configs from before [generate] keep their text and id
            plain["generate"] = dataclasses.asdict(self.generate)
        plain["stability"] = {name: dict(table) for name, table in self.stability.items()}
        plain["run"] = dataclasses.asdict(self.run)
        return plain

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def _set_keys(section: str, table: dict[str, Any]) -> dict[str, Any]:
    """``table`` without the :data:`OPTIONAL_KEYS` of ``section`` that hold their defaults."""
    optional = OPTIONAL_KEYS.get(section, {})
    return {key: value for key, value in table.items() if key not in optional or value != optional[key]}
