"""Runnable studies: ``python -m looplab.examples.<name> --help`` (or ``python examples/<name>.py`` in a checkout)."""
