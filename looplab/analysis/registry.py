"""Mechanistic metrics: the contract, the registry and the one runner that writes them.

The contract of an entry: a function ``(inputs) -> MetricResult`` decorated with
``@register_metric("name")``. ``inputs`` is the :class:`AnalysisInput` of one
traced forward (the trace, and the tensors every metric shares, each computed
once on first use); the result holds

- ``summary``: entries for summary.json (JSON-able; merged in registration order),
- ``tables``: file name → (header, rows), written as CSV,
- ``plots``: file name → a function that draws the figure to the path it is given
  (saving it with :func:`looplab.plotting.save_figure`: a PNG and a PDF, atomically).

:func:`run_metrics` computes every registered metric, then writes each file
atomically (a temporary sibling renamed into place) and summary.json last, so
a folder with a summary.json holds a complete analysis.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from torch import Tensor

from looplab.analysis.colsum import colsum_trace
from looplab.errors import LooplabError, choice_error
from looplab.experiment import Experiment
from looplab.io import atomic_write
from looplab.model.protocol import LoopedModel
from looplab.model.trace import Trace
from looplab.params import POSITIVE, at_least, param
from looplab.plugins import register_entry
from looplab.progress import Progress

__all__ = ["AnalysisOptions", "AnalysisInput", "MetricResult", "METRICS", "register_metric", "run_metrics"]


@dataclass(frozen=True)
class AnalysisOptions:
    """The mechanistic analysis's parameters, declared once: the CLI, sweeps and Python take these defaults."""

    loops: int = param(128, at_least(1), "loops r to unroll (the paper uses 128)")
    samples: int = param(8, at_least(1), "instances of the task at its longest training length")
    window: int = param(0, at_least(0), "the last W >= 2 loops the token dynamics classify; 0: max(2, loops // 4)")
    tol: float = param(1e-3, POSITIVE, "the token dynamics' cosine tolerance")
    max_period: int = param(8, at_least(1), "the longest orbit period the token dynamics search")
    mlp_ablation: bool = param(True, None, "also re-trace with each core layer's MLP zeroed (one trace per layer)")
    metrics: list[str] = param([], None, "the metrics to compute, by name (empty: every registered one)")
    plots: bool = param(True, None, "draw each metric's figures")
    zero_mlp: str = param("", None, "an MLP whose output is zeroed for the whole analysis: preludeI, coreI or codaI")

    def __post_init__(self):
        if self.window == 1:
            raise LooplabError("analysis.window must be 0 (automatic) or >= 2, got 1: one loop shows no dynamics")
        for name in self.metrics:
            if name not in METRICS:
                raise choice_error("analysis metric", name, METRICS)

    def selected(self) -> dict[str, Metric]:
        """The metrics this analysis computes, in registration order."""
        return {name: metric for name, metric in METRICS.items() if not self.metrics or name in self.metrics}

    @property
    def needs_attention(self) -> bool:
        """Whether a selected metric reads attention probabilities (else the trace records states only)."""
        return any(name not in STATES_ONLY for name in self.selected())

    @property
    def dynamics_window(self) -> int:
        """The W the token dynamics use."""
        return self.window or max(2, self.loops // 4)


@dataclass
class AnalysisInput:
    """One traced forward and what the metrics derive from it.

    Attributes:
        exp: the analysed experiment (model, task, config) when a looplab run is analysed, else None.
        recorded: the trace, attention included, for ``loops`` loops of ``samples`` instances.
        label: the name plot titles start with.
        retrace: runs the same trace again (e.g. after an ablation changes the model).
        options: the analysis options.
        model: the analysed model, any of the looped-model protocol (``looplab.model.protocol``);
            ``exp.model`` when not given.
        training_depth: the depth the plots mark (a native looped LM's own loop count, or None);
            a run's T_train when ``exp`` is given and this is not.
    """

    exp: Experiment | None
    recorded: Trace
    label: str
    retrace: Callable[[], Trace]
    options: AnalysisOptions = field(default_factory=AnalysisOptions)
    model: LoopedModel | None = None
    training_depth: int | None = None

    def __post_init__(self):
        if self.exp is not None:
            from looplab.experiment import training_depth

            self.model = self.exp.model if self.model is None else self.model
            self.training_depth = (
                training_depth(self.exp.config) if self.training_depth is None else self.training_depth
            )
        if self.model is None:
            raise LooplabError("an analysis input needs a model (or the experiment that holds one)")

    @property
    def loops(self) -> int:
        return self.recorded.total_loops

    @property
    def valid(self) -> Tensor:
        """[B, T] bool."""
        return self.recorded.valid

    @cached_property
    def states(self) -> Tensor:
        """X_{ℓ,t} in float64: [loops, layers, B, T, d]."""
        return self.recorded.states().double()

    @cached_property
    def attention(self) -> Tensor:
        """A_{ℓ,t}: [loops, layers, B, H, T, T]."""
        return self.recorded.attention()

    @cached_property
    def loop_states(self) -> Tensor:
        """h_t: [loops, B, T, d]."""
        return self.recorded.loop_states()

    @cached_property
    def colsum(self) -> Tensor:
        """ColSum concentration per loop, layer and head: [loops, layers, H]."""
        return colsum_trace(self.recorded)


@dataclass
class MetricResult:
    """What one metric hands the runner (see the module docstring)."""

    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, tuple[list[str], Iterable[Iterable[Any]]]] = field(default_factory=dict)
    plots: dict[str, Callable[[Path], None]] = field(default_factory=dict)


Metric = Callable[[AnalysisInput], MetricResult]
METRICS: dict[str, Metric] = {}
#: the metrics that read states only: an analysis of these alone traces without attention
STATES_ONLY: set[str] = set()


def register_metric(name: str, attention: bool = True) -> Callable[[Metric], Metric]:
    """Function decorator: every mechanistic analysis computes the metric and writes its files.

    ``attention=False`` declares that the metric reads no attention probabilities.
    """

    def register(metric: Metric) -> Metric:
        register_entry(METRICS, name, metric, "metric")
        if not attention:
            STATES_ONLY.add(name)
        return metric

    return register


def run_metrics(inputs: AnalysisInput, out: Path, header: dict[str, Any], progress: bool = False) -> dict[str, Any]:
    """Compute the selected metrics (``inputs.options.metrics``; all by default) and write their files to
    ``out``, figures unless ``inputs.options.plots`` is off; returns the summary (``header`` first, then
    each metric's entries). ``progress`` shows which metric runs."""
    results = []
    selected = inputs.options.selected()
    with Progress("analyze", len(selected), unit="metric", enabled=progress) as bar:
        for name, metric in selected.items():
            results.append(metric(inputs))
            bar.advance(detail=name)
    out.mkdir(parents=True, exist_ok=True)
    summary = dict(header)
    for result in results:
        for name, (columns, rows) in result.tables.items():
            atomic_write(out / name, partial(_write_csv, header=columns, rows=rows))
        for name, draw in result.plots.items() if inputs.options.plots else ():
            draw(out / name)  # plots save through looplab.plotting.save_figure, atomically
        summary.update(result.summary)
    atomic_write(out / "summary.json", lambda path: path.write_text(json.dumps(summary, indent=2)))
    return summary


def _write_csv(path: Path, header: list[str], rows: Iterable[Iterable[Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
