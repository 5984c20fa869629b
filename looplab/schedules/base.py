"""The schedule contract and its registry.

A schedule gives every training row its supervision depth τ (and the loss at
it), and says at which depth a trained model is read at test time. To add one,
subclass :class:`DepthRule` (depths from a rule) or :class:`Schedule` (learned
depths), name the ``[schedule]`` keys it reads in ``params``, and decorate it
with :func:`register_schedule`.

What a schedule receives at construction:

- ``params``: its own parameters, the ``[schedule]`` keys it lists in
  ``params``, each checked against :data:`PARAM_DOMAINS` (plus the class's
  :meth:`Schedule.check` for constraints between keys); reading a key it did
  not list is an error, so the list is the whole truth;
- a :class:`ScheduleContext`: the task (for T(n)), the model width (for a
  halting head), this process's :class:`~looplab.parallel.Parallel` rank, and
  the truncated-backprop depth.

What the framework calls:

- before anything is built, :meth:`Schedule.check` (constraints between its parameters),
  :meth:`Schedule.check_task` (against T(train_max)) and :meth:`Schedule.test_depth_bound`
  (a test depth its parameters fix, which must lie within ``eval.max_loops``);
- :meth:`Schedule.training_loss` once per step, with the step's generator;
  it must draw any per-row randomness through ``context.parallel`` so a rank
  of a data-parallel run trains its rows as one process would (the contract
  test checks this on a two-rank split);
- :meth:`Schedule.hazard_logit` after every loop of an evaluation unroll
  (None for schedules without a halting head) and :meth:`Schedule.test_depths`
  with what it returned;
- :meth:`Schedule.state_dict` / :meth:`Schedule.load_state_dict` around
  checkpoints (JSON-able), and ``module`` (trained and checkpointed with the model).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import ClassVar

import torch
from torch import Tensor, nn

from looplab.config import ScheduleConfig
from looplab.errors import LooplabError, choice_error
from looplab.model import LoopedTransformer
from looplab.model.looped import LoopProbe
from looplab.parallel import SINGLE, Parallel
from looplab.schedules.objectives import depth_supervised_loss
from looplab.tasks import Task, TaskBatch

#: (low, high, low inclusive, high inclusive) of every [schedule] number a schedule may read
PARAM_DOMAINS: dict[str, tuple[float, float, bool, bool]] = {
    "depth": (1, math.inf, True, False),
    "window": (0, math.inf, True, False),
    "t_max": (1, math.inf, True, False),
    "entropy_weight": (0, math.inf, True, False),
    "baseline_momentum": (0, 1, True, False),
    "ponder_prior": (0, 1, False, False),
    "ponder_beta": (0, math.inf, True, False),
    "lr_scale": (0, math.inf, False, False),
    "mu": (-math.inf, math.inf, False, False),
    "sigma": (0, math.inf, True, False),
    "mean_depth": (1, math.inf, True, False),
    "lo": (1, math.inf, True, False),
    "hi": (1, math.inf, True, False),
}


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule is built with besides its parameters.

    Attributes:
        task: the task, for rules in the instance size (T(n)); None for plain samplers.
        d_model: the model's width, for a halting head; None when the schedule has none.
        parallel: this process's rank among the data-parallel ranks.
        backprop_loops: k > 0 backpropagates through each row's last k loops only (rule schedules).
    """

    task: Task | None = None
    d_model: int | None = None
    parallel: Parallel = SINGLE
    backprop_loops: int = 0


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
    #: the [schedule] keys this schedule reads (its parameters)
    params: ClassVar[tuple[str, ...]] = ()
    #: learned parameters (e.g. a halting head), trained and checkpointed with the model
    module: nn.Module | None = None

    def __init__(self, cfg: ScheduleConfig, context: ScheduleContext = ScheduleContext()):
        self.cfg = SimpleNamespace(**{key: getattr(cfg, key) for key in self.params})
        self.context = context

    @property
    def task(self) -> Task:
        if self.context.task is None:
            raise LooplabError(f"the {self.name} schedule needs the task (for T(n)); pass ScheduleContext(task=...)")
        return self.context.task

    @property
    def parallel(self) -> Parallel:
        return self.context.parallel

    @classmethod
    def check(cls, cfg: ScheduleConfig) -> None:
        """Raise :class:`LooplabError` for constraints between parameters (the domains are checked generically)."""

    @classmethod
    def check_task(cls, cfg: ScheduleConfig, deepest: int) -> None:
        """Raise :class:`LooplabError` for parameters that contradict the task: ``deepest`` is T(train_max),
        the most steps a training instance needs."""

    @classmethod
    def test_depth_bound(cls, cfg: ScheduleConfig) -> int | None:
        """The deepest test-time depth the parameters allow whatever the instance (None: it grows with n)."""
        return None

    @abstractmethod
    def training_loss(
        self, model: LoopedTransformer, batch: TaskBatch, generator: torch.Generator, probe: bool = False
    ) -> StepOutput:
        """The loss of one training batch (this rank's rows), its statistics, and (if ``probe``) the probe states."""

    def hazard_logit(self, h: Tensor, valid: Tensor) -> Tensor | None:
        """[B] halting logit of the state h [B, L, d] after a loop, or None without a halting head."""
        return None

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
    """

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
        out = model.forward_at_depths(
            batch.tokens,
            batch.valid,
            depths,
            self.parallel.fork(generator),
            backprop_loops=self.context.backprop_loops,
            return_probe=probe,
        )
        logits, found = out if probe else (out, None)
        loss = depth_supervised_loss(logits, batch.labels, depths.to(logits.device))
        return StepOutput(loss, depth_stats(depths), found)

    def test_depths(self, lengths, hazard_logits):
        return self.policy_depth(lengths)

    def _offsets(self, count: int, generator: torch.Generator) -> Tensor:
        """Δ ~ U{-w..w}, [count] long."""
        w = self.cfg.window
        return self.parallel.draw_rows(lambda n: torch.randint(-w, w + 1, (n,), generator=generator), count)


SCHEDULES: dict[str, type[Schedule]] = {}


def register_schedule(cls: type[Schedule]) -> type[Schedule]:
    """Class decorator: make ``cls`` available as ``schedule.name = cls.name``."""
    known = {f.name for f in fields(ScheduleConfig)}
    unknown = [key for key in cls.params if key not in known]
    if unknown:
        raise ValueError(f"schedule {cls.name!r} lists parameters that [schedule] does not have: {unknown}")
    SCHEDULES[cls.name] = cls
    return cls


def check_schedule_config(cfg: ScheduleConfig) -> type[Schedule]:
    """The registered class of ``cfg.name``, after checking the parameters it reads; one-line errors."""
    if cfg.name not in SCHEDULES:
        raise choice_error("value for schedule.name:", cfg.name, SCHEDULES)
    cls = SCHEDULES[cfg.name]
    for key in cls.params:
        value = getattr(cfg, key)
        if key in PARAM_DOMAINS and not _inside(value, *PARAM_DOMAINS[key]):
            low, high, low_in, high_in = PARAM_DOMAINS[key]
            raise LooplabError(
                f"schedule.{key} must be in {'[' if low_in else '('}{low:g}, {high:g}"
                f"{']' if high_in else ')'} for the {cfg.name} schedule, got {value!r}"
            )
    cls.check(cfg)
    return cls


def make_schedule(cfg: ScheduleConfig, context: ScheduleContext = ScheduleContext()) -> Schedule:
    """The schedule ``cfg`` names, with its parameters checked."""
    return check_schedule_config(cfg)(cfg, context)


def _inside(value: float, low: float, high: float, low_in: bool, high_in: bool) -> bool:
    if isinstance(value, bool) or not math.isfinite(value):
        return False
    return (value >= low if low_in else value > low) and (value <= high if high_in else value < high)
