"""Run configuration: typed dataclasses, TOML load/save, ``section.key=value`` overrides.

A config file has the sections ``[task]``, ``[model]``, ``[schedule]``,
``[train]``, ``[eval]``, ``[generate]``, ``[stability]`` and ``[run]``; every key
is optional and defaults to the value declared beside it: in ``schema.py`` for the
fixed sections, by the chosen schedule for ``[schedule]``, by each regulariser for
``[stability.NAME]`` and by each exit for ``[eval.exits.NAME]`` and
``[generate.exits.NAME]``. Unknown sections or keys, wrongly typed values and values
outside a key's domain raise :class:`LooplabError` naming the valid options.
This package depends on nothing in looplab but its errors, the parameter
declarations (``looplab.params``) and the plugin loader (``looplab.plugins``).
"""

from looplab.config.checks import validate
from looplab.config.load import from_dict, load_config, parse_override, read_toml, resolve_preset
from looplab.config.schema import (
    ATTENTIONS,
    DEFAULT_SAMPLES,
    INIT_SCALINGS,
    INIT_STATES,
    INJECT_INITS,
    INJECTIONS,
    NORMS,
    PLACEMENT_ALIASES,
    POSITIONALS,
    PRECISIONS,
    PRESETS,
    Config,
    EvalConfig,
    GenerateConfig,
    ModelConfig,
    RunConfig,
    ScheduleConfig,
    TaskConfig,
    TrainConfig,
)

__all__ = [
    "ATTENTIONS",
    "DEFAULT_SAMPLES",
    "INIT_SCALINGS",
    "INIT_STATES",
    "INJECT_INITS",
    "INJECTIONS",
    "NORMS",
    "PLACEMENT_ALIASES",
    "POSITIONALS",
    "PRECISIONS",
    "PRESETS",
    "Config",
    "EvalConfig",
    "GenerateConfig",
    "ModelConfig",
    "RunConfig",
    "ScheduleConfig",
    "TaskConfig",
    "TrainConfig",
    "from_dict",
    "load_config",
    "parse_override",
    "read_toml",
    "resolve_preset",
    "validate",
]
