"""The example plugins' entries (looplab/examples/plugins), collected without leaving them registered.

Every family's contract test runs over its built-in entries and these, so a new
entry is checked the moment it is registered; the registries themselves stay
built-in only, so no other test sees a plugin it did not ask for. Your own
plugins join them with ``LOOPLAB_TEST_PLUGINS=my_pkg.my_schedule,path/to/my_exit.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from looplab import regularisers, token_exits
from looplab.analysis import registry as metrics
from looplab.eval import exits
from looplab.examples.plugins import MODULES
from looplab.generation import decoders, policies
from looplab.model import placements
from looplab.plugins import load_plugins
from looplab.report import paper as papers
from looplab.schedules import base as schedules
from looplab.studies import load_studies
from looplab.tasks import base as tasks

load_studies()  # the built-in papers are registered by the studies

REGISTRIES = {
    "schedule": schedules.SCHEDULES,
    "regulariser": regularisers.REGULARISERS,
    "exit": exits.EXITS,
    "metric": metrics.METRICS,
    "task": tasks.TASKS,
    "placement": placements.PLACEMENTS,
    "token_exit": token_exits.EXITS,
    "paper": papers.PAPERS,
    "decoder": decoders.DECODERS,
    "cache_policy": policies.POLICIES,
}


def _collect() -> dict[str, dict[str, object]]:
    before = {family: dict(registry) for family, registry in REGISTRIES.items()}
    declared = dict(schedules._DECLARED)
    for module in MODULES:
        importlib.import_module(module)
    load_plugins([name for name in os.environ.get("LOOPLAB_TEST_PLUGINS", "").split(",") if name.strip()])
    added = {
        family: {k: v for k, v in registry.items() if k not in before[family]}
        for family, registry in REGISTRIES.items()
    }
    for family, registry in REGISTRIES.items():
        registry.clear()
        registry.update(before[family])
    schedules._DECLARED.clear()
    schedules._DECLARED.update(declared)
    return added


PLUGIN_ENTRIES = _collect()


@contextlib.contextmanager
def installed(family: str, name: str):
    """Register the plugin entry ``name`` of ``family`` for the duration of the block (built-ins are no-ops)."""
    registry = REGISTRIES[family]
    entry = PLUGIN_ENTRIES[family].get(name)
    if entry is None:
        yield
        return
    registry[name] = entry
    saved = dict(schedules._DECLARED)
    if family == "schedule":
        schedules.register_schedule(entry)
    try:
        yield
    finally:
        registry.pop(name, None)
        schedules._DECLARED.clear()
        schedules._DECLARED.update(saved)


def names(family: str) -> list[str]:
    """Built-in entries of ``family``, then the example plugins' (sorted within each)."""
    return sorted(REGISTRIES[family]) + sorted(PLUGIN_ENTRIES[family])
