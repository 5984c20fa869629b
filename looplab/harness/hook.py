"""The post-import hook ``looplab-lm-eval.pth`` installs at interpreter start (see :mod:`looplab.harness`).

Only the standard library is imported here: this module runs in every Python process of the
environment. :func:`install` puts a finder at the front of ``sys.meta_path`` that answers for
nothing but ``lm_eval.models``: it finds that module's spec with the finders after it, wraps its
loader so that the ``looplab`` placeholder is registered once the module has run, and removes itself.
"""

from __future__ import annotations

import importlib.abc
import sys

__all__ = ["install"]

WATCHED = "lm_eval.models"


class _RegisterAfter(importlib.abc.Loader):
    """A loader that runs ``loader`` and then registers the ``looplab`` model."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # the rest (is_package, get_resource_reader, ...) is the loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        from looplab.harness import register

        register()


class _WaitForLmEval(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != WATCHED:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisterAfter(spec.loader)
                return spec
        return None


def install() -> None:
    """Register the ``looplab`` lm-eval model as soon as lm-eval registers its own (once per process)."""
    if WATCHED in sys.modules:  # lm-eval already loaded (install called late): register now
        from looplab.harness import register

        register()
    elif not any(isinstance(finder, _WaitForLmEval) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WaitForLmEval())
