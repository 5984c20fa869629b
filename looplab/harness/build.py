"""Build step (never imported at run time): ship ``looplab-lm-eval.pth`` at the root of site-packages.

``pyproject.toml`` names :class:`BuildPyWithPth` as setuptools' ``build_py`` (``[tool.setuptools.cmdclass]``;
setuptools loads this file by its path, without importing looplab). A wheel installs whatever lies at the
root of ``build_lib``; an editable install (PEP 660) builds nothing into ``build_lib`` but writes the
directory ``install_lib`` points at into its wheel, so the file goes there.
"""

from __future__ import annotations

from pathlib import Path

from setuptools.command.build_py import build_py

#: the file's name and its one line (site runs a .pth line that starts with ``import``)
PTH_NAME = "looplab-lm-eval.pth"
PTH_LINE = "import looplab.harness.hook; looplab.harness.hook.install()\n"


class BuildPyWithPth(build_py):
    """setuptools' ``build_py``, and the ``.pth`` that registers the lm-eval model (:mod:`looplab.harness`)."""

    def run(self) -> None:
        super().run()
        self.mkpath(self._pth_root())
        Path(self._pth_root(), PTH_NAME).write_text(PTH_LINE, encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self._pth_root(), PTH_NAME))]

    def _pth_root(self) -> str:
        if self.editable_mode:
            return self.get_finalized_command("install").install_lib
        return self.build_lib
