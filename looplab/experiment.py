"""The objects a config describes, built fresh or loaded from a run directory.

:func:`check_config` checks what the config schema alone cannot (registered
task and schedule names, the parameters the schedule and each regulariser
declare) and completes the config with those components' defaults; every
entry point calls it before writing anything, once: a checked config carries the mark of
its check, and :func:`checked` checks only a config without it (or one changed since), so
a command checks its config once and passes it down. :meth:`Experiment.build` makes the
task, model, schedule and regularisers; :meth:`Experiment.from_run` also loads a run's
latest checkpoint.

A config whose ``model.pretrained`` names a model dir fine-tunes that dir's looped model instead
of building a :class:`LoopedTransformer`: the model is the dir's adapter on the looped-model
protocol (``looplab.lm.model_dir``), loaded in ``model.pretrained_dtype``, and the task is
``text`` (:class:`looplab.tasks.tokenized.TokenizedText`) with the dir's own tokenizer, its depth
T(n) the model's own loop count. lm lies below experiment in the layering (experiment builds lm's
models); the model-dir module is imported when a config names a dir: nothing of transformers is
imported otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from looplab.checkpoint import latest_checkpoint, load_weights, read_state
from looplab.config import Config, load_config
from looplab.config.load import config_source
from looplab.errors import LooplabError, choice_error
from looplab.exits import complete_exits
from looplab.memory import FLOAT, check_fits, parameter_count
from looplab.model import LoopedTransformer
from looplab.model.placements import placement
from looplab.parallel import SINGLE, Parallel
from looplab.params import as_dict
from looplab.regularisers import Regulariser, build_regularisers, complete_stability
from looplab.rundir import CONFIG_FILE, load_run_config
from looplab.schedules import SCHEDULES, DepthRule, Schedule, ScheduleContext, make_schedule, resolve_schedule
from looplab.tasks import TASKS, Task, make_task
from looplab.tasks.pool import PooledTask, check_pool_task, pool_header
from looplab.tasks.tokenized import NEEDS_MODEL_DIR, TokenizedText
from looplab.token_exits import check_token_exits

__all__ = [
    "Experiment",
    "check_config",
    "check_pretrained_fits",
    "checked",
    "config_task",
    "open_pretrained",
    "is_checked",
    "on_device",
    "check_sizes",
    "check_device",
    "all_finite",
    "training_depth",
]

#: the attribute of a checked config holding what it held when it was checked (``Config.to_dict``)
_CHECKED = "_checked_as"


def load_checked_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """The config at ``path`` with its ``--set`` ``overrides`` (:func:`looplab.config.load_config`), checked
    by :func:`check_config` (each component filled in with its defaults); an error names the file and the
    overrides it came from."""
    config = load_config(path, overrides)
    try:
        return check_config(config)
    except LooplabError as err:
        raise LooplabError(f"{config_source(path, overrides)}: {err}") from None


def is_checked(config: Config) -> bool:
    """Whether ``config`` passed :func:`check_config` and holds what it held then."""
    return getattr(config, _CHECKED, None) == config.to_dict()


def checked(config: Config) -> Config:
    """``config``, checked by :func:`check_config` unless it already is (:func:`is_checked`): the one
    check a command makes, wherever the config is passed down."""
    return config if is_checked(config) else check_config(config)


def on_device(config: Config, device: str) -> Config:
    """A copy of ``config`` that runs on ``device`` (a rank's own ``cuda:N``), still checked if ``config`` is:
    the device itself is checked where the experiment is built (:func:`check_device`)."""
    moved = dataclasses.replace(config, run=dataclasses.replace(config.run, device=device))
    if is_checked(config):
        setattr(moved, _CHECKED, moved.to_dict())
    return moved


def check_sizes(task: Task | type[Task], what: str, sizes: list[int], training: bool = False) -> None:
    """A one-line error when a size in ``sizes`` lies outside what ``task`` draws (with ``training``: trains on),
    naming the valid range."""
    high = (task.max_train_size or task.max_size) if training else task.max_size
    span = f"{task.min_size}..{high if high is not None else 'any'}"
    if high is not None and max(sizes) > high:
        raise LooplabError(f"{what} must be <= {high} for task {task.name!r}, got {max(sizes)} (valid: {span})")
    if min(sizes) < task.min_size:
        raise LooplabError(
            f"{what} must be >= {task.min_size} for task {task.name!r}, got {min(sizes)} (valid: {span})"
        )


def check_config(config: Config) -> Config:
    """One-line errors for an unknown task or schedule, a size the task cannot draw, a schedule or
    regulariser parameter outside its domain, or contradictions between sections.

    Completes ``config`` in place: ``[schedule]`` holds exactly the chosen schedule's
    parameters, ``[stability]`` every registered regulariser's table and ``[eval.exits]`` every
    registered exit's, defaults filled in (``[generate.exits]`` is checked, not completed),
    so a run dir's config.toml states every value the run used. Returns ``config``, marked checked
    (:func:`is_checked`).
    """
    if config.task.name not in TASKS:
        raise choice_error("value for task.name:", config.task.name, TASKS)
    task = TASKS[config.task.name]
    opened = check_pretrained_task(config, task)
    check_sizes(task, "task.train_min", [config.task.train_min], training=True)
    check_sizes(task, "task.train_max", [config.task.train_max], training=True)
    check_sizes(task, "task.eval_lengths", config.task.eval_lengths)
    schedule, params = resolve_schedule(config.schedule)
    config.schedule.params = as_dict(params)
    config.stability = complete_stability(config.stability)
    config.eval.exits = complete_exits(config.eval.exits, config.eval.max_loops)
    config.generate.exits = check_token_exits(config.generate.exits)
    segmented = config.train.segment_loops > 0
    if config.train.backprop_loops and not (issubclass(schedule, DepthRule) or segmented):
        raise LooplabError(f"train.backprop_loops needs a rule schedule; {config.schedule.name!r} learns its depths")
    instance = config_task(config, opened)
    deepest = int(instance.steps(torch.tensor([config.task.train_max])))
    check_deep_supervision(schedule, params, config, deepest)
    check_shared_view(schedule, config)
    placement(config.model.placement)
    if config.model.recurrence == "trm" and config.model.injection != "add":
        raise LooplabError(
            f"model.recurrence = 'trm' sums its inputs (z from e + y + z, y from y + z): it needs "
            f"model.injection = 'add', got {config.model.injection!r}"
        )
    if task.needs_causal and not config.model.causal and opened is None:  # a model dir's LM is causal itself
        raise LooplabError(
            f"task {task.name!r} predicts each next byte: it needs model.causal = true "
            "(bidirectional attention sees the bytes it predicts)"
        )
    bound = schedule.test_depth_bound(params)
    if bound is not None and bound > config.eval.max_loops:
        raise LooplabError(
            f"the {config.schedule.name} schedule reads answers at up to {bound} loops, beyond eval.max_loops = "
            f"{config.eval.max_loops}: raise eval.max_loops to at least {bound}"
        )
    if config.task.pool:
        check_pool(config)
    schedule.check_task(params, deepest)
    if config.model.positional == "learned":
        longest = max([config.task.train_max, *config.task.eval_lengths])
        width = instance.seq_len(longest)
        if width > config.model.max_len:
            raise LooplabError(
                f"learned positions reach model.max_len = {config.model.max_len}, but a size-{longest} instance "
                f"of {task.name!r} is {width} tokens long: raise max_len to at least {width}"
            )
    setattr(config, _CHECKED, config.to_dict())
    return config


def open_pretrained(config: Config):
    """The model dir ``model.pretrained`` names, opened without its weights (a ``looplab.lm.model_dir.ModelDir``):
    one-line errors for a path that is not a model dir, an unsupported model, and a decoder not yet looped."""
    from looplab.lm.model_dir import not_looped, open_model_dir

    opened = open_model_dir(config.model.pretrained, config.model.pretrained_tokenizer or None)
    if opened.kind == "source":
        raise not_looped(opened)
    return opened


def check_pretrained_task(config: Config, task: type[Task]):
    """A model dir goes with task ``text`` and task ``text`` with a model dir, whose windows it must fit;
    returns the opened dir (None without ``model.pretrained``). One-line errors."""
    tokenized = issubclass(task, TokenizedText)
    if config.task.text_file and not tokenized:
        raise LooplabError(f"task.text_file applies to task 'text' (a model dir's tokenizer), not {task.name!r}")
    if not config.model.pretrained:
        if tokenized:
            raise LooplabError(NEEDS_MODEL_DIR)
        return None
    if not tokenized:
        kind = "bytes" if task.is_text else "its own symbols"
        raise LooplabError(
            f"model.pretrained reads text with the model dir's own tokenizer: it needs task.name = 'text', "
            f"not {task.name!r} (whose tokens are {kind})"
        )
    opened = open_pretrained(config)
    if config.train.adapter == "lora":
        from looplab.lm.adapters import check_targets

        check_targets(config.train.adapter_targets, opened.linear_names)
    longest = max([config.task.train_max, *config.task.eval_lengths])
    if longest > opened.max_window:
        raise LooplabError(
            f"task windows reach {longest} tokens (task.train_max, task.eval_lengths), beyond the "
            f"{opened.max_window} the model dir {opened.path} takes"
        )
    if config.task.text_file:  # its tokens (read once a process: training reads them next)
        task = config_task(config, opened)
        task.check_window(longest)
        check_token_ids(task, opened)
    return opened


def config_task(config: Config, opened=None) -> Task:
    """The task ``config`` trains on: the registered task of ``task.name`` or, with ``model.pretrained``
    (``opened``: that dir, opened already), task ``text`` bound to the dir's tokenizer and loop count."""
    if not config.model.pretrained:
        return make_task(config.task.name, config.task.alphabet)
    opened = opened if opened is not None else open_pretrained(config)
    return TASKS[config.task.name](
        config.task.alphabet, tokenizer=opened.tokenizer, text_file=config.task.text_file, depth=opened.native_loops
    )


def check_pretrained_fits(config: Config, opened=None, training: bool = False) -> None:
    """Refuse a model dir whose weights in ``model.pretrained_dtype`` do not fit ``run.device``, in one line;
    with ``training``, with AdamW's gradients and two moments (3 more copies; none of the frozen weights under
    ``train.adapter``) and a lower bound on what backward keeps: per token of a batch, the logits and their
    gradient and, for each of T_train loops, one layer's activations (18 d numbers, and its heads' attention
    over the window); with ``train.checkpoint_loops`` one loop's, and each loop's input."""
    opened = opened if opened is not None else open_pretrained(config)
    dtype = getattr(torch, config.model.pretrained_dtype)
    extra = 0
    if training:
        window, depth = config.task.train_max, training_depth(config)
        layer = 18 * opened.width + opened.heads * window
        kept = layer + depth * opened.width if config.train.checkpoint_loops else depth * layer
        per_token = 2 * len(opened.tokenizer) + kept
        copies = 3 if config.train.adapter == "none" else 0
        extra = copies * opened.weight_bytes(dtype) + FLOAT * config.train.batch_size * window * per_token
    opened.check_fits(dtype, config.run.device, "fine-tuning" if training else "loading", extra)


def check_token_ids(task: Task, opened) -> None:
    """Refuse a text whose token ids, under the dir's tokenizer, reach past the model's embedding rows (a
    tokenizer with tokens the weights lack), in one line, before any weight is read."""
    rows = getattr(opened.config, "vocab_size", None)
    if not isinstance(rows, int):
        return
    for split in ("train", "val"):
        ids = task.tokens(split)
        if ids.numel() and int(ids.max()) >= rows:
            source = task.text_file or "the KJV corpus"
            raise LooplabError(
                f"the text {source} holds token id {int(ids.max())} under the tokenizer of {opened.path}, past "
                f"the model's {rows} embedding rows (config.json vocab_size): its tokenizer and weights do not match"
            )


def check_pool(config: Config) -> None:
    """A one-line error when ``task.pool`` is not a pool of this task, or holds sizes training never draws."""
    header = pool_header(config.task.pool)
    check_pool_task(config.task.pool, header, config.task.name, config.task.alphabet)
    outside = sorted(n for n in header.sizes if not config.task.train_min <= n <= config.task.train_max)
    if outside:
        raise LooplabError(
            f"task.pool holds sizes {outside} outside the training range "
            f"{config.task.train_min}..{config.task.train_max}: training would never draw them"
        )


def check_shared_view(schedule: type[Schedule], config: Config) -> None:
    """A one-line error when ``train.shared_view_weight`` > 0 meets what its two unrolls do not cover: the shared
    cache's view is a causal looped LM's (one core call per layer and loop, looplab's own model), trained at one
    depth per row by a rule schedule, without deep supervision or a regulariser of the loop."""
    if config.train.shared_view_weight == 0:
        return
    model, what = config.model, f"train.shared_view_weight = {config.train.shared_view_weight:g}"
    refusals = [  # a model dir first: the other advice is about looplab's own model's settings
        (bool(model.pretrained), "applies to looplab's own model, not a model dir (model.pretrained)"),
        (not model.causal, "needs model.causal = true (the shared cache is a causal decoder's)"),
        (
            model.init_state == "noise" and model.injection != "none",
            "trains for decoding, which a loop started from noise (model.init_state = 'noise') cannot do "
            "(each token would need its own draw): use model.init_state = 'embed' or 'zeros'",
        ),
        (model.recurrence != "standard", "needs model.recurrence = 'standard' (one core call per layer and loop)"),
        (config.train.segment_loops > 0, "does not combine with deep supervision (train.segment_loops > 0)"),
        (
            not issubclass(schedule, DepthRule) or schedule.several_depths,
            f"needs a rule schedule with one depth per row, not {config.schedule.name!r}: valid choices: "
            + ", ".join(
                sorted(n for n, cls in SCHEDULES.items() if issubclass(cls, DepthRule) and not cls.several_depths)
            ),
        ),
        (bool(build_regularisers(config)), "does not combine with a [stability] regulariser (its probe states)"),
    ]
    for refused, why in refusals:
        if refused:
            raise LooplabError(f"{what} {why}")


def check_deep_supervision(schedule: type[Schedule], params, config: Config, deepest: int) -> None:
    """A one-line error when ``train.segment_loops`` and the schedule do not go together: deep supervision cuts
    the deepest training unroll (T_train, from ``deepest`` = T(train_max)) into whole segments of k loops, for a
    rule schedule's depth as for a segment-halting schedule's ``t_max``."""
    k, name, mode = config.train.segment_loops, config.schedule.name, schedule.deep_supervision
    if k > 0 and mode == "refused":
        takers = sorted(n for n, cls in SCHEDULES.items() if cls.deep_supervision != "refused")
        raise LooplabError(
            f"train.segment_loops = {k} (deep supervision) does not apply to the {name} schedule; "
            f"it applies to: {', '.join(takers)}"
        )
    if mode == "required" and k == 0:
        raise LooplabError(f"the {name} schedule halts between deep-supervision segments: set train.segment_loops > 0")
    if mode == "required" and params.t_max % k:
        raise LooplabError(
            f"the {name} schedule's schedule.t_max = {params.t_max} must be a whole number of segments "
            f"of train.segment_loops = {k}"
        )
    depth = schedule.training_depth(params, deepest)
    if mode == "optional" and k > depth:
        raise LooplabError(
            f"train.segment_loops = {k} is longer than the {name} schedule's deepest training depth {depth}: "
            f"one segment would hold the whole unroll; use train.segment_loops in 1..{depth}"
        )
    if mode == "optional" and k > 0 and depth % k:
        raise LooplabError(
            f"the {name} schedule's deepest training depth {depth} must be a whole number of segments "
            f"of train.segment_loops = {k}: use a depth of {depth - depth % k} or {depth - depth % k + k}, "
            f"or segments that divide {depth}"
        )
    if k > 0 and config.train.backprop_loops > k:
        raise LooplabError(
            f"train.backprop_loops = {config.train.backprop_loops} counts loops within a segment: "
            f"at most train.segment_loops = {k}"
        )


def training_depth(config: Config) -> int:
    """T_train: the deepest depth the config's schedule supervises (the schedule says, from T(train_max))."""
    schedule, params = resolve_schedule(config.schedule)
    task = config_task(config)
    return int(schedule.training_depth(params, int(task.steps(torch.tensor([config.task.train_max]))[0])))


def check_device(device: str) -> None:
    """A one-line error when ``run.device`` names a device this machine does not have."""
    if device == "cpu":
        return
    name, _, index = device.partition(":")
    if name != "cuda" or (index and not index.isdigit()):
        raise LooplabError(f"run.device {device!r} is not 'cpu', 'cuda' or 'cuda:N'")
    count = torch.cuda.device_count()
    if int(index or 0) >= count:
        found = f"{count} CUDA device(s), cuda:0..cuda:{count - 1}" if count else "no CUDA device"
        raise LooplabError(
            f"run.device = {device!r}, but this machine has {found}; valid choices: cpu"
            + (", cuda[:N]" if count else "")
        )


def all_finite(modules: dict[str, torch.nn.Module]) -> bool:
    """Whether every parameter and buffer of ``modules`` is finite."""
    return all(
        bool(torch.isfinite(t).all())
        for module in modules.values()
        for t in [*module.parameters(), *module.buffers()]
        if t.is_floating_point()
    )


@dataclass
class Experiment:
    """The objects a config describes."""

    config: Config
    task: Task
    model: LoopedTransformer | torch.nn.Module  # a model dir's adapter on the looped-model protocol
    schedule: Schedule
    regularisers: list[Regulariser] = field(default_factory=list)
    checkpoint: str | None = None
    #: the model dir ``model.pretrained`` names, as opened for the build (its tokenizer, loops, family);
    #: None for looplab's own model
    source: Any = None

    @staticmethod
    def build(config: Config, parallel: Parallel = SINGLE) -> Experiment:
        """Fresh objects, the model initialised from ``run.seed``; ``parallel`` is this process's rank.

        ``config`` is checked unless it already is (:func:`checked`)."""
        checked(config)
        check_device(config.run.device)
        torch.manual_seed(config.run.seed)
        source = None
        if config.model.pretrained:
            task, model, source = Experiment._pretrained(config)
            width = source.width
        else:
            task = make_task(config.task.name, config.task.alphabet)
            check_fits(
                f"a model of d_model = {config.model.d_model}",
                FLOAT * parameter_count(config, task.vocab_size),
                config.run.device,
                "use a smaller model.d_model or fewer layers",
            )
            model = LoopedTransformer(config.model, task.vocab_size).to(config.run.device)
            width = config.model.d_model
        train = config.train
        model.checkpoint_loops = train.checkpoint_loops  # read by looplab.model.depths.at_depths
        context = ScheduleContext(
            task, width, parallel, train.backprop_loops, train.segment_loops, train.shared_view_weight
        )
        schedule = make_schedule(config.schedule, context)
        if schedule.module is not None:
            schedule.module.to(config.run.device)
        return Experiment(config, task, model, schedule, build_regularisers(config), source=source)

    @staticmethod
    def _pretrained(config: Config) -> tuple[Task, torch.nn.Module, Any]:
        """The text task on the dir's tokenizer, the dir's adapter (its weights read once, in
        ``model.pretrained_dtype``; a mixture of experts runs its eager loop, which forward-mode AD for
        the JSRR penalty needs) and the opened dir."""
        opened = open_pretrained(config)
        check_pretrained_fits(config, opened)
        task = config_task(config, opened)
        if not config.task.text_file:  # the KJV corpus (a text file was checked with the config)
            check_token_ids(task, opened)
        model = opened.load(getattr(torch, config.model.pretrained_dtype), config.run.device, eager_experts=True)
        train = config.train
        if train.adapter == "lora":
            from looplab.lm.adapters import attach_lora

            model = attach_lora(model, train.adapter_rank, train.adapter_alpha, train.adapter_targets, config.run.seed)
        return task, model, opened

    @staticmethod
    def from_run(run_dir: str | Path) -> Experiment:
        """The experiment of a run directory, with the weights of its latest checkpoint, in eval mode."""
        config = load_run_config(run_dir)
        try:
            check_config(config)
        except LooplabError as err:  # a value the run's config may not hold: say which file holds it
            raise LooplabError(f"{Path(run_dir) / CONFIG_FILE}: {err}") from None
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise LooplabError(f"run dir {run_dir} has no checkpoint yet; train it first")
        read_state(checkpoint)  # a checkpoint whose state train would refuse is refused here too
        exp = Experiment.build(config)
        load_weights(checkpoint, exp.modules())
        if not all_finite(exp.modules()):
            raise LooplabError(f"checkpoint {checkpoint} holds non-finite weights; nothing to evaluate or analyse")
        exp.model.eval()
        exp.checkpoint = checkpoint.name
        return exp

    @cached_property
    def training_task(self) -> Task:
        """Where training draws its instances: the task, or the task over its ``task.pool``."""
        if not self.config.task.pool:
            return self.task
        return PooledTask(self.task, self.config.task.pool)

    def modules(self) -> dict[str, torch.nn.Module]:
        """Everything with weights, by checkpoint file name."""
        found = {"model": self.model}
        if self.schedule.module is not None:
            found["schedule"] = self.schedule.module
        return found
