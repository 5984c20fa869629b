"""Headless matplotlib for every figure looplab writes."""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, imported on first use.

    Agg draws to files without a display (servers, CI, sweep workers), and the
    lazy import keeps matplotlib off the start-up path of commands that plot nothing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
