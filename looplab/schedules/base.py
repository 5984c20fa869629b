"""The schedule contract and its registry.

A schedule gives every training row its supervision depth τ (and the loss at
it), and says at which depth a trained model is read at test time. To add one,
subclass :class:`DepthRule` (depths from a rule) or :class:`Schedule` (learned
depths), declare its ``[schedule]`` keys as a ``Params`` dataclass (fields made
with :func:`looplab.params.param`: default and domain), and decorate it with
:func:`register_schedule`. A module of its own is enough: name it in
``[run] plugins`` to use it from the CLI and sweeps.

What a schedule receives at construction:

- ``params``: an instance of its ``Params``, from the ``[schedule]`` keys it
  declares, each typed and inside its domain (plus the class's
  :meth:`Schedule.check` for constraints between keys). Keys another
  registered schedule declares are ignored, so one sweep can share them across
  schedules; a key no schedule declares is an error. A key declared by two
  schedules must be declared alike (type, default, domain): one key, one meaning;
- a :class:`ScheduleContext`: the task (for T(n)), the model width (for a
  halting head), this process's :class:`~looplab.parallel.Parallel` rank, and
  the truncated-backprop depth.

What the framework calls:

- before anything is built, :meth:`Schedule.check` (constraints between its parameters),
  :meth:`Schedule.check_task` (against T(train_max)) and :meth:`Schedule.test_depth_bound`
  (a test depth its parameters fix, which must lie within ``eval.max_loops``);
- for reports, ``label`` (formatted with its parameters) and :meth:`Schedule.training_depth`
  (the deepest depth it supervises, T_train);
- :meth:`Schedule.training_loss` once per step, with the step's generator;
  it must draw any per-row randomness through ``context.parallel`` so a rank
  of a data-parallel run trains its rows as one process would (the contract
  test checks this on a two-rank split);
- :meth:`Schedule.hazard_logit` after every loop of an evaluation unroll
  (None for schedules without a halting head) and :meth:`Schedule.test_depths`
  with what it returned; halting applied as the rows run (``looplab eval``'s
  halting-on pass, generation's ``halting`` exit) stops a row where
  :meth:`Schedule.halts` says: the first loop that is a multiple of
  ``halt_every`` whose logit is > 0;
- ``deep_supervision`` says whether the schedule trains under
  ``train.segment_loops`` > 0 (``"optional"``: a rule schedule's depth becomes the
  cap of a segmented unroll; ``"required"``: it halts between segments;
  ``"refused"``);
- :meth:`Schedule.state_dict` / :meth:`Schedule.load_state_dict` around
  checkpoints (JSON-able), and ``module`` (trained and checkpointed with the model,
  at ``lr_scale`` × the model's learning rate).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, get_type_hints

import torch
from torch import Tensor, nn

from looplab.config import ScheduleConfig
from looplab.errors import LooplabError, choice_error
from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopProbe
from looplab.model.shared_view import shared_view_at_depths
from looplab.parallel import SINGLE, Parallel
from looplab.params import at_least, domain_of, fill, param
from looplab.plugins import check_complete, register_entry
from looplab.schedules.objectives import depth_supervised_loss
from looplab.schedules.segments import SegmentEnd, supervise_segments
from looplab.tasks import Task, TaskBatch


@dataclass
class ConstantDepth:
    """The constant depth c: trained at (fixed) or only read at (the random-loop samplers)."""

    depth: int = param(20, at_least(1), "the depth read at test time")


@dataclass
class DepthWindow:
    """The window w around a centre depth, and the clip bound t_max."""

    window: int = param(5, at_least(0), "training depths lie within ± window of the centre")
    t_max: int = param(20, at_least(1), "training depths are clipped to t_max")


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule is built with besides its parameters.

    Attributes:
        task: the task, for rules in the instance size (T(n)); None for plain samplers.
        d_model: the model's width, for a halting head; None when the schedule has none.
        parallel: this process's rank among the data-parallel ranks.
        backprop_loops: k > 0 backpropagates through each row's last k loops only (each segment's,
            under deep supervision).
        segment_loops: k > 0 trains under deep supervision with segments of k loops (``segments.py``).
        shared_view_weight: w > 0 also trains in the ``shared`` KV cache's view
            (:mod:`looplab.model.shared_view`): the loss is (1 − w) × the ordinary one + w × the view's.
    """

    task: Task | None = None
    d_model: int | None = None
    parallel: Parallel = SINGLE
    backprop_loops: int = 0
    segment_loops: int = 0
    shared_view_weight: float = 0.0


@dataclass
class StepOutput:
    """What a schedule's training loss hands the trainer.

    Attributes:
        loss: scalar to minimise.
        stats: scalar statistics to log (``block_evals`` and ``row_loops_mean`` at least).
        probe: states at each row's supervised depth, for a one-loop regulariser (when asked).
    """

    loss: Tensor
    stats: dict[str, float]
    probe: LoopProbe | None = None


def depth_stats(depths: Tensor) -> dict[str, float]:
    """Cost of a step with per-row depths [B] or [B, J].

    ``block_evals``: core applications of a batch-parallel unroll (max τ);
    ``row_loops_mean``: mean τ, what active-set compaction actually pays per row.
    """
    per_row = depths.view(depths.shape[0], -1).max(dim=1).values.float()
    return {"block_evals": float(per_row.max()), "row_loops_mean": float(per_row.mean())}


class Schedule(ABC):
    """A training objective over depth plus a test-time depth rule."""

    name: ClassVar[str] = ""
    #: under ``train.segment_loops`` > 0: "optional", "required" or "refused"
    deep_supervision: ClassVar[str] = "refused"
    #: halting applied as rows run reads the halting logit after every ``halt_every``-th loop
    halt_every: int = 1
    #: what a report calls it, formatted with its parameters ("fixed K = {depth}")
    label: ClassVar[str] = ""
    #: whether a row may be supervised at several depths in one step ([B, J] depths)
    several_depths: ClassVar[bool] = False

    @dataclass
    class Params:
        """The [schedule] keys this schedule reads (none)."""

    #: learned parameters (e.g. a halting head), trained and checkpointed with the model
    module: nn.Module | None = None

    def __init__(self, cfg: ScheduleConfig, context: ScheduleContext = ScheduleContext()):
        self.params = schedule_params(type(self), cfg)
        self.context = context

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The [schedule] keys this schedule declares."""
        return tuple(f.name for f in dataclasses.fields(cls.Params))

    @classmethod
    def describe(cls, params: Any) -> str:
        """``label`` filled in with ``params`` (the name when it has no label)."""
        return cls.label.format(**dataclasses.asdict(params)) if cls.label else cls.name

    @property
    def lr_scale(self) -> float:
        """The learning rate of ``module`` as a multiple of the model's."""
        return 1.0

    @property
    def task(self) -> Task:
        if self.context.task is None:
            raise LooplabError(f"the {self.name} schedule needs the task (for T(n)); pass ScheduleContext(task=...)")
        return self.context.task

    @property
    def parallel(self) -> Parallel:
        return self.context.parallel

    @classmethod
    def check(cls, params: Any) -> None:
        """Raise :class:`LooplabError` for constraints between parameters (the domains are checked generically)."""

    @classmethod
    def check_task(cls, params: Any, deepest: int) -> None:
        """Raise :class:`LooplabError` for parameters that contradict the task: ``deepest`` is T(train_max),
        the most steps a training instance needs."""

    @classmethod
    def test_depth_bound(cls, params: Any) -> int | None:
        """The deepest test-time depth the parameters allow whatever the instance (None: it grows with n)."""
        return None

    @classmethod
    @abstractmethod
    def training_depth(cls, params: Any, deepest: int) -> int:
        """T_train: the deepest depth training supervises, given ``deepest`` = T(train_max)."""

    @abstractmethod
    def training_loss(
        self, model: LoopedTransformer, batch: TaskBatch, generator: torch.Generator, probe: bool = False
    ) -> StepOutput:
        """The loss of one training batch (this rank's rows), its statistics, and (if ``probe``) the probe states."""

    def hazard_logit(self, h: Tensor, valid: Tensor) -> Tensor | None:
        """[B] halting logit of the state h [B, L, d] after a loop, or None without a halting head."""
        return None

    def halts(self, h: Tensor, valid: Tensor, t: int) -> Tensor:
        """[B] bool: the rows whose head says halt after loop t, the rule every halting-on path applies
        (a loop that is a multiple of ``halt_every`` whose logit is > 0; never without a head)."""
        if t % self.halt_every:
            return torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)
        logit = self.hazard_logit(h, valid)
        return torch.zeros(h.shape[0], dtype=torch.bool, device=h.device) if logit is None else logit > 0

    @abstractmethod
    def test_depths(self, lengths: Tensor, hazard_logits: Tensor | None) -> Tensor:
        """[N] long test-time depths; learned schedules read ``hazard_logits`` [N, T] (from :meth:`hazard_logit`)."""

    def state_dict(self) -> dict:
        """JSON-able state besides ``module`` (e.g. a reward baseline)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class DepthRule(Schedule):
    """A schedule given by a rule: depths from the instance sizes alone.

    Under data parallelism each row's depth is drawn as for the global batch
    (:meth:`Parallel.draw_rows`), so a rank trains its rows at the depths
    single-process training would use.

    Under deep supervision (``train.segment_loops`` > 0) each row's deepest depth
    is the cap of a segmented unroll (``segments.py``): supervised at every
    segment's end and at the cap.
    """

    deep_supervision = "optional"

    @abstractmethod
    def train_depths(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        """Depths for a batch of sizes ``lengths`` [B].

        Returns [B] long (one supervised depth per row) or [B, J] long (several;
        entries <= 0 are unused), ready for ``LoopedTransformer.forward_at_depths``.
        """

    @abstractmethod
    def policy_depth(self, lengths: Tensor) -> Tensor:
        """[B] long: the depth at which each row is read at test time."""

    def training_loss(self, model, batch, generator, probe=False):
        depths = self.train_depths(batch.lengths, generator)
        if self.context.segment_loops > 0:
            return self._segmented_loss(model, batch, depths, generator, probe)
        if self.context.shared_view_weight > 0:
            return self._shared_view_loss(model, batch, depths, generator)
        args = (batch.tokens, batch.valid, depths, self.parallel.fork(generator), self.context.backprop_loops)
        logits, found = model.probe_at_depths(*args) if probe else (model.forward_at_depths(*args), None)
        loss = depth_supervised_loss(logits, batch.labels, depths.to(logits.device))
        return StepOutput(loss, depth_stats(depths), found)

    def test_depths(self, lengths, hazard_logits):
        return self.policy_depth(lengths)

    def _shared_view_loss(self, model, batch, depths, generator):
        """(1 − w) × the ordinary unroll's loss + w × the shared cache view's, each at the row's depth."""
        ordinary, viewed = shared_view_at_depths(
            model, batch.tokens, batch.valid, depths, self.parallel.fork(generator), self.context.backprop_loops
        )
        labels, at = batch.labels, depths.to(ordinary.device)
        losses = depth_supervised_loss(ordinary, labels, at), depth_supervised_loss(viewed, labels, at)
        weight = self.context.shared_view_weight
        stats = depth_stats(depths)
        stats["block_evals"] *= 2  # two unrolls
        stats |= {"loss_ordinary": float(losses[0].detach()), "loss_shared_view": float(losses[1].detach())}
        return StepOutput((1 - weight) * losses[0] + weight * losses[1], stats)

    def _segmented_loss(self, model, batch, depths, generator, probe):
        cap = depths.view(depths.shape[0], -1).max(dim=1).values

        def at_cap(end: SegmentEnd) -> tuple[Tensor, Tensor]:
            return torch.zeros_like(end.task_loss), end.last

        run = supervise_segments(
            model,
            batch,
            self.parallel.fork(generator),
            self.context.segment_loops,
            cap,
            at_cap,
            self.context.backprop_loops,
            probe,
        )
        stats = {**depth_stats(cap), "segments_mean": float(run.segments.float().mean())}
        return StepOutput(run.loss, stats, run.probe)

    def _offsets(self, w: int, count: int, generator: torch.Generator) -> Tensor:
        """Δ ~ U{-w..w}, [count] long."""
        return self.parallel.draw_rows(lambda n: torch.randint(-w, w + 1, (n,), generator=generator), count)


SCHEDULES: dict[str, type[Schedule]] = {}
#: every [schedule] key a registered schedule declares: (type, default, domain) and the first declarer
_DECLARED: dict[str, tuple[tuple[Any, Any, Any], str]] = {}


def register_schedule(cls: type[Schedule]) -> type[Schedule]:
    """Class decorator: make ``cls`` available as ``schedule.name = cls.name``.

    Raises ValueError when a name is taken by another class, when the class leaves a method of the
    contract unimplemented, or when a key is declared unlike another schedule's declaration of it
    (type, default or domain).
    """
    taken = SCHEDULES.get(cls.name)  # the name first: a clash is the problem, whatever else the class lacks
    if taken is not None and _qualified(taken) != _qualified(cls):
        raise ValueError(f"schedule name {cls.name!r} is taken by {_qualified(taken)}")
    check_complete(cls, cls.name, "schedule")
    types = get_type_hints(cls.Params)  # resolved, whether the module postpones annotations or not
    for declared in dataclasses.fields(cls.Params):
        shape = (types[declared.name], declared.default, domain_of(declared))
        first = _DECLARED.setdefault(declared.name, (shape, cls.name))
        if first[0] != shape and first[1] != cls.name:
            raise ValueError(
                f"schedule {cls.name!r} declares [schedule] key {declared.name!r} unlike the {first[1]} schedule "
                f"(type, default, domain {shape} vs {first[0]}): give it another name"
            )
    register_entry(SCHEDULES, cls.name, cls, "schedule")
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def schedule_params(cls: type[Schedule], cfg: ScheduleConfig) -> Any:
    """``cls.Params`` from the [schedule] table ``cfg``: its own keys typed and in their domains, keys of other
    schedules ignored, a key no schedule declares an error; then ``cls.check``."""
    own = cls.keys()
    owner = f" for the {cls.name} schedule"
    for key in cfg.params:
        if key not in own and key not in _DECLARED:
            raise choice_error(f"key in [schedule]{owner}", key, own or ["(none: it has no parameters)"])
    params = fill(cls.Params, {key: value for key, value in cfg.params.items() if key in own}, "schedule", owner)
    cls.check(params)
    return params


def _schedule_class(name: str) -> type[Schedule]:
    if name not in SCHEDULES:
        raise choice_error("value for schedule.name:", name, SCHEDULES)
    return SCHEDULES[name]


def resolve_schedule(cfg: ScheduleConfig) -> tuple[type[Schedule], Any]:
    """The registered class ``cfg.name`` names and its checked parameters; one-line errors."""
    cls = _schedule_class(cfg.name)
    return cls, schedule_params(cls, cfg)


def make_schedule(cfg: ScheduleConfig, context: ScheduleContext = ScheduleContext()) -> Schedule:
    """The schedule ``cfg`` names; its constructor checks the parameters (``schedule_params``)."""
    return _schedule_class(cfg.name)(cfg, context)
