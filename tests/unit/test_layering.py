"""The package's layering: every import (top-level or inside a function) points down or sideways, never up,
and the units of one layer import each other without a cycle."""

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import looplab

PACKAGE = Path(looplab.__file__).parent

#: lowest first; a unit is a top-level module or subpackage of looplab
LAYERS = [
    {"looplab", "errors", "seeding", "io", "plotting", "progress", "params", "plugins", "provenance"},
    {"config"},
    {"tasks", "model"},
    {"parallel", "checkpoint", "memory", "rundir"},
    {"schedules", "stability"},
    {"regularisers", "exits", "token_exits"},
    {"lm"},
    {"experiment"},
    {"train", "eval", "analysis"},
    {"generation"},
    {"text"},
    {"sweep", "report", "harness", "serve"},
    {"studies"},
    {"cli", "__main__", "examples"},
]
LAYER_OF = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "looplab"


def _imports(path: Path) -> set[str]:
    """Every looplab module ``path`` imports, wherever the import statement stands, and every one it names
    to ``importlib.import_module`` (a string, or a module-level name bound to one)."""
    tree = ast.parse(path.read_text(), str(path))
    strings = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("looplab"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("looplab")}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            argument = node.args[0] if node.args else None
            name = argument.value if isinstance(argument, ast.Constant) else strings.get(getattr(argument, "id", ""))
            if isinstance(name, str) and name.startswith("looplab"):
                found.add(name)
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


def _module_edges() -> dict[str, set[str]]:
    """module → the modules of its own package it imports (anywhere in the file), ``__init__`` left out:
    a package's ``__init__`` gathers its modules' names, and that is not a circle between two files."""
    files = {_module(path): path for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    edges = defaultdict(set)
    for module, path in files.items():
        package = module.rsplit(".", 1)[0]
        for target in _imports(path):
            if target in files and target != module and target.rsplit(".", 1)[0] == package:
                edges[module].add(target)
    return edges


def test_no_import_cycles_between_the_files_of_one_package():
    """Two files of one package never import each other, directly or around a ring, not even inside a
    function (which would hide the circle from Python's import order, not from the design)."""
    edges = _module_edges()
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(target) :] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_the_study_code_is_never_imported_by_the_library():
    """The engine and everything below it name no study: only the command line and the examples import one."""
    importers = sorted(source for source, targets in _edges().items() if "studies" in targets)
    assert set(importers) <= {"cli", "examples", "__main__"}, importers


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["generate", "--help"]])
def test_the_commands_on_one_run_start_without_the_report_chain(argv):
    probe = (
        f"import sys; from looplab.cli import main; main({argv!r}); "
        "print(sorted(m for m in sys.modules if m.startswith(('looplab.report', 'looplab.studies', 'scipy'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip().splitlines()[-1] == "[]"
