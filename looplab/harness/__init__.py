"""looplab's LMs in lm-evaluation-harness: ``lm_eval --model looplab --model_args path=DIR,...``.

The model, :class:`looplab.harness.model.LooplabLM`, answers lm-eval's three request types
(``loglikelihood``, ``loglikelihood_rolling``, ``generate_until``) through
:func:`looplab.generation.score` and :func:`looplab.generation.generate`, each token read at its
exit's depth; its model_args are listed there.

How lm-eval finds it. lm-eval 0.4 keeps a model registry (``lm_eval.api.registry.model_registry``,
lazy ``"module:Class"`` placeholders) but discovers no plugins: nothing outside lm-eval is imported
unless it registers itself. The ways to get there, and why this one:

- a pass-through CLI (``python -m looplab.harness ...``, registering first) works anywhere but is
  not ``lm_eval`` itself, so scripts and docs written for lm-eval need editing;
- importing looplab (or lm_eval) at interpreter start from a ``.pth`` file would cost every Python
  start torch's import time;
- a post-import hook (chosen): the install puts ``looplab-lm-eval.pth`` in site-packages; its one
  line imports :mod:`looplab.harness.hook` (the standard library only) and installs a finder that
  waits for ``lm_eval.models`` — the module in which lm-eval registers its own models — and adds
  the ``looplab`` placeholder right after it runs. Nothing else is imported at start, and
  ``import looplab.harness.model`` happens only when lm-eval asks for ``--model looplab``.

setuptools cannot ship a ``.pth`` from configuration alone, so ``[tool.setuptools.cmdclass]`` points
``build_py`` at :mod:`looplab.harness.build`, which writes it into wheels and editable installs
alike. ``python -m looplab.harness`` remains as lm-eval's own CLI with the model registered, for a
checkout used without installing. Either way a :class:`~looplab.errors.LooplabError` that leaves lm-eval
uncaught (a bad model_arg, ``--batch_size``, a generation argument) is one line on stderr and exit 2,
not a traceback: :func:`register` installs a ``sys.excepthook`` for it (``LOOPLAB_DEBUG=1`` keeps the
traceback).
"""

from __future__ import annotations

__all__ = ["MODEL_NAME", "TARGET", "register"]

#: the name lm-eval's ``--model`` takes, and where lm-eval imports the class from when asked for it
MODEL_NAME = "looplab"
TARGET = "looplab.harness.model:LooplabLM"


def register() -> None:
    """Add the ``looplab`` placeholder to lm-eval's model registry (after lm-eval's own models, so that
    a registry holding only ``looplab`` never hides them), unless it is there already."""
    import lm_eval.models  # noqa: F401  (lm-eval registers its own models here)
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=TARGET)
    _one_line_errors()


def _one_line_errors() -> None:
    """Make an uncaught :class:`~looplab.errors.LooplabError` one line on stderr and exit status 2."""
    import os
    import sys

    from looplab.errors import LooplabError

    previous = sys.excepthook
    if getattr(previous, "looplab", False) or os.environ.get("LOOPLAB_DEBUG"):
        return

    def hook(kind, error, traceback) -> None:
        if not issubclass(kind, LooplabError):
            previous(kind, error, traceback)
            return
        sys.stdout.flush()
        print(f"looplab: error: {error}", file=sys.stderr, flush=True)
        os._exit(2)  # the interpreter would exit 1 after an excepthook returns

    hook.looplab = True
    sys.excepthook = hook
