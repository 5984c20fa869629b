"""Run configuration: typed dataclasses, TOML load/save, ``section.key=value`` overrides.

A config file has the sections ``[task]``, ``[model]``, ``[schedule]``,
``[train]``, ``[eval]``, ``[stability]`` and ``[run]``; every key is optional
and defaults to the field value in ``schema.py``. Unknown sections or keys,
wrongly typed values and values outside a key's choices raise
:class:`LooplabError` naming the valid options. This package depends on
nothing in looplab but its errors.
"""

from looplab.config.checks import fixed_exit_depth, validate
from looplab.config.load import from_dict, load_config, parse_override, read_toml, resolve_preset
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
    PRESETS,
    Config,
    EvalConfig,
    JsrrConfig,
    ModelConfig,
    RunConfig,
    ScheduleConfig,
    StabilityConfig,
    TaskConfig,
    TrainConfig,
)

__all__ = [
    "ATTENTIONS",
    "DEFAULT_FIXED_EXIT",
    "INIT_SCALINGS",
    "INIT_STATES",
    "INJECT_INITS",
    "INJECTIONS",
    "JSRR_ESTIMATORS",
    "NORMS",
    "PLACEMENT_ALIASES",
    "PLACEMENTS",
    "POSITIONALS",
    "PRECISIONS",
    "PRESETS",
    "Config",
    "EvalConfig",
    "JsrrConfig",
    "ModelConfig",
    "RunConfig",
    "ScheduleConfig",
    "StabilityConfig",
    "TaskConfig",
    "TrainConfig",
    "fixed_exit_depth",
    "from_dict",
    "load_config",
    "parse_override",
    "read_toml",
    "resolve_preset",
    "validate",
]
