"""The package's layering: every import (top-level or inside a function) points down or sideways, never up,
and the units of one layer import each other without a cycle."""

import ast
from collections import defaultdict
from pathlib import Path

import looplab

PACKAGE = Path(looplab.__file__).parent

#: lowest first; a unit is a top-level module or subpackage of looplab
LAYERS = [
    {"looplab", "errors", "seeding", "io", "plotting", "progress", "params", "plugins"},
    {"config"},
    {"tasks", "model"},
    {"parallel", "checkpoint", "memory", "rundir"},
    {"schedules", "stability"},
    {"regularisers", "exits"},
    {"experiment"},
    {"train", "eval", "analysis", "lm", "generation"},
    {"sweep", "report"},
    {"cli", "__main__", "examples"},
]
LAYER_OF = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "looplab"


def _imports(path: Path) -> set[str]:
    """Every looplab module ``path`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("looplab"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("looplab")}
    return found


def _module(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def _edges() -> dict[str, set[str]]:
    edges = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _unit(_module(path))
        for target in map(_unit, _imports(path)):
            if target != source:
                edges[source].add(target)
    return edges


def test_every_unit_has_a_layer():
    units = {_unit(_module(path)) for path in PACKAGE.rglob("*.py")}
    assert units - LAYER_OF.keys() == set(), "add the new module or subpackage to LAYERS"


def test_imports_never_point_up():
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in _edges().items()
        for target in targets
        if LAYER_OF[target] > LAYER_OF[source]
    )
    assert upward == []


def test_config_depends_on_nothing_but_errors_parameters_and_plugins():
    assert _edges()["config"] <= {"errors", "params", "plugins"}


def test_no_import_cycles_between_units():
    edges = _edges()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = 1
        for target in sorted(edges[unit]):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(target) :] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[unit] = 2

    for unit in sorted(edges):
        if unit not in state:
            visit(unit, [unit])
