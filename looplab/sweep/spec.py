"""A sweep file, and its expansion into run points (configs × grid overrides × seeds).

A sweep file is TOML::

    [sweep]
    configs = ["../stopping-small/*-fixed.toml", "my.toml"]  # globs, relative to this file
    seeds = 5                  # or a list, e.g. [0, 3, 7]
    set = ["train.steps=600"]  # overrides applied to every point
    scaling = false            # also write the test-time scaling curve
    evaluate = true            # evaluate each trained point (false: e.g. untrained models, analysis only)
    analyze = false            # also run the mechanistic analysis
    analyze_loops = 128
    analyze_samples = 8
    mlp_ablation = true        # the analysis re-traces with each core MLP zeroed (one trace per layer)
    analyze_metrics = []       # the analysis metrics to compute (empty: all)
    analyze_plots = true       # the analysis draws its figures
    pretrain = "pretrain.toml" # fine-tune every point from a pretrained run (below); relative to this file

    [grid]                     # cartesian product of overrides (optional)
    "model.placement" = ["pre", "post"]

Every point runs with one torch thread (``run.threads = 1``), and lives in
``runs/<id>`` where ``id`` hashes its resolved config, so the same point in two
sweeps (or twice in one) is the same run.

With ``pretrain``, every point is a fine-tune: the pretrain config, at the point's
seed and with the point's own ``[model]`` (fine-tuning keeps the model's shape),
is a run point of its own, trained first, and the point starts from its weights
(``train.init_from = "runs/<its id>"``, read from the sweep dir). Points of one
seed and model shape share one pretrained run, as a paper's arms share the
checkpoint they fine-tune.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import tomli_w

from looplab.analysis.registry import AnalysisOptions
from looplab.config import Config, load_config, read_toml, resolve_preset
from looplab.errors import LooplabError, choice_error
from looplab.experiment import check_config, load_checked_config
from looplab.params import at_least, fill, param
from looplab.rundir import RUNS_DIR

ANALYSIS = AnalysisOptions()  # the mechanistic analysis's defaults


@dataclass(frozen=True)
class SweepOptions:
    """What a sweep does with each point besides training it (the [sweep] keys other than configs, seeds, set)."""

    scaling: bool = param(False, None, "also write the test-time scaling curve")
    evaluate: bool = param(True, None, "evaluate each trained point")
    analyze: bool = param(False, None, "also run the mechanistic analysis")
    analyze_loops: int = param(ANALYSIS.loops, at_least(1))
    analyze_samples: int = param(ANALYSIS.samples, at_least(1))
    mlp_ablation: bool = param(ANALYSIS.mlp_ablation, None, "the analysis re-traces with each core MLP zeroed")
    analyze_metrics: list[str] = param([], None, "the analysis metrics to compute (empty: all)")
    analyze_plots: bool = param(ANALYSIS.plots, None, "the analysis draws its figures")


SWEEP_KEYS = ("configs", "seeds", "set", "pretrain", *(f.name for f in fields(SweepOptions)))
TOP_KEYS = ("sweep", "grid")


@dataclass
class RunPoint:
    """One (config, overrides, seed) of a sweep.

    Attributes:
        run_id: the first 12 hex digits of the SHA-256 of the resolved config's TOML.
        variant: the point's name without its seed: the config file's stem (its
            ``<task>-`` prefix dropped) plus ``+key=value`` for each grid override.
        config_toml: the resolved config, as written to the run dir.
        after: the run id of the pretrained point this one fine-tunes (None: it starts fresh).
    """

    run_id: str
    variant: str
    config_toml: str
    after: str | None = None


@dataclass
class SweepSpec:
    """A parsed sweep file; see the module docstring for its keys. ``options`` holds what the sweep does
    with each point besides training it."""

    configs: list[Path]
    seeds: list[int]
    overrides: list[str] = field(default_factory=list)
    grid: dict[str, list] = field(default_factory=dict)
    options: SweepOptions = field(default_factory=SweepOptions)
    pretrain: Path | None = None

    def analysis_options(self) -> dict | None:
        """The options each point's mechanistic analysis runs with (None: the sweep analyses nothing)."""
        return analysis_options(self.options)

    def points(self) -> list[RunPoint]:
        """Every distinct run point, in file × grid × seed order; pretrained points (with ``pretrain``) first."""
        pretrained: dict[str, RunPoint] = {}
        points: dict[str, RunPoint] = {}
        keys = list(self.grid)
        for path in self.configs:
            for values in itertools.product(*(self.grid[key] for key in keys)):
                grid_sets = [f"{key}={_toml_value(value)}" for key, value in zip(keys, values)]
                labels = [f"+{key}={value}" for key, value in zip(keys, values)]
                for seed in self.seeds:
                    sets = [*self.overrides, *grid_sets, f"run.seed={seed}", "run.threads=1"]
                    config = load_checked_config(path, sets)
                    variant = "".join([path.stem.removeprefix(f"{config.task.name}-"), *labels])
                    after = None
                    if self.pretrain is not None:
                        base = self._pretrain_point(config, seed)
                        pretrained.setdefault(base.run_id, base)
                        after = base.run_id
                        config = replace(config, train=replace(config.train, init_from=f"{RUNS_DIR}/{after}"))
                    text = config.to_toml()
                    point = RunPoint(toml_id(text), variant, text, after)
                    points.setdefault(point.run_id, point)
        return [*pretrained.values(), *points.values()]

    def _pretrain_point(self, config: Config, seed: int) -> RunPoint:
        """The pretrain config at ``seed`` with ``config``'s model; its variant names the model keys that
        differ from the pretrain file's own (``pretrain+model.injection=contractive``)."""
        own = load_config(self.pretrain, [f"run.seed={seed}", "run.threads=1"])
        base = replace(own, model=config.model)
        check_config(base)
        differ = [
            f"+model.{key}={value}" for key, value in asdict(config.model).items() if getattr(own.model, key) != value
        ]
        text = base.to_toml()
        return RunPoint(toml_id(text), "".join([self.pretrain.stem.removeprefix(f"{base.task.name}-"), *differ]), text)


def analysis_options(options: SweepOptions) -> dict | None:
    """The :class:`AnalysisOptions` fields a sweep's ``analyze*`` keys set (None when it does not analyse)."""
    if not options.analyze:
        return None
    return {
        "loops": options.analyze_loops,
        "samples": options.analyze_samples,
        "mlp_ablation": options.mlp_ablation,
        "metrics": list(options.analyze_metrics),
        "plots": options.analyze_plots,
    }


def toml_id(config_toml: str) -> str:
    """A stable 12-hex-digit name for a resolved config, from its TOML text."""
    return hashlib.sha256(config_toml.encode()).hexdigest()[:12]


def config_id(config: Config) -> str:
    """A stable 12-hex-digit name for a resolved config."""
    return toml_id(config.to_toml())


def _toml_value(value) -> str:
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def load_sweep(path: str | Path) -> SweepSpec:
    """Parse and check a sweep file (or bundled sweep preset); every problem is a one-line :class:`LooplabError`."""
    path = resolve_preset(path)
    data = read_toml(path, "sweep file")
    try:
        return _sweep_spec(path, data)
    except LooplabError as err:  # say which sweep file holds the problem, unless the message does
        message = str(err)
        raise LooplabError(message if str(path) in message else f"sweep file {path}: {message}") from None


def _sweep_spec(path: Path, data: dict) -> SweepSpec:
    """The checked :class:`SweepSpec` of sweep file ``path``'s tables ``data``."""
    for key in data:
        if key not in TOP_KEYS:
            raise choice_error("sweep file section", key, TOP_KEYS)
    table = data.get("sweep", {})
    for key in table:
        if key not in SWEEP_KEYS:
            raise choice_error("key in [sweep]", key, SWEEP_KEYS)
    seeds = table.get("seeds", 1)
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise LooplabError(f"[sweep] seeds must be a count >= 1 or a list of integers, got {seeds!r}")
    grid = data.get("grid", {})
    for key, values in grid.items():
        if "." not in key or not isinstance(values, list) or not values:
            raise LooplabError(f"[grid] {key!r} must be section.key = [non-empty list of values]")
    overrides = table.get("set", [])
    if not isinstance(overrides, list) or not all(isinstance(text, str) for text in overrides):
        raise LooplabError("[sweep] set must be a list of 'section.key=value' strings")
    pretrain = table.get("pretrain")
    if pretrain is not None and not (isinstance(pretrain, str) and (path.parent / pretrain).is_file()):
        raise LooplabError(f"[sweep] pretrain must name a config file (relative to {path.parent}), got {pretrain!r}")
    own_keys = ("configs", "seeds", "set", "pretrain")
    options = fill(SweepOptions, {k: v for k, v in table.items() if k not in own_keys}, "sweep")
    if options.analyze:
        import looplab.analysis.mechanistic  # noqa: F401  (registers the metrics analyze_metrics names)

        fill(AnalysisOptions, analysis_options(options), "sweep")
    spec = SweepSpec(
        _config_paths(path, table.get("configs")),
        sorted(set(seeds)),
        overrides,
        grid,
        options,
        None if pretrain is None else path.parent / pretrain,
    )
    spec.points()  # resolve every config now, so a bad key fails before anything runs
    return spec


def _config_paths(sweep_file: Path, patterns) -> list[Path]:
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise LooplabError(f"[sweep] configs must be a non-empty list of config paths or globs, in {sweep_file}")
    paths: list[Path] = []
    for pattern in patterns:
        found = sorted(glob.glob(str(sweep_file.parent / pattern)))
        if not found:
            raise LooplabError(f"[sweep] configs: nothing matches {pattern!r} (relative to {sweep_file.parent})")
        paths += [Path(p) for p in found if Path(p) not in paths]
    return paths
