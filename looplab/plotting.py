"""Headless matplotlib for every figure looplab writes, in one style.

Every figure is drawn with the same sizes and fonts (:data:`STYLE`), gives each
schedule the same colour in every figure (:func:`color_for`), and is saved by
:func:`save_figure` as a PNG (for reports) with a PDF beside it (vector, for papers).
"""

from __future__ import annotations

from pathlib import Path

from looplab.io import atomic_write

STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "figure.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "savefig.dpi": 110,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,  # TrueType in PDFs: editable text for papers
}
DPI = 110
#: one colour per schedule, the same in every figure (matplotlib's tab10 order)
SCHEDULE_COLORS = {
    "fixed": "C0",
    "matched": "C1",
    "window": "C2",
    "rl_halting": "C3",
    "fixed_window": "C4",
    "multi_depth": "C5",
    "pondernet": "C6",
    "lognormal": "C7",
    "poisson_lognormal": "C8",
}
# for variants no schedule colours, and for a second variant of one schedule in the same figure
SPARE_COLORS = ("C9", "tab:olive", "tab:cyan", "black", "tab:brown")


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend with :data:`STYLE`, imported on first use.

    Agg draws to files without a display (servers, CI, sweep workers), and the
    lazy import keeps matplotlib off the start-up path of commands that plot nothing.
    """
    import logging

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the PDF backend subsets fonts through fontTools, which logs a warning per font whose
    # timestamps predate 1970 (DejaVu's); it says nothing about the figure
    logging.getLogger("fontTools").setLevel(logging.ERROR)

    plt.rcParams.update(STYLE)
    return plt


def color_for(name: str, others=()) -> str:
    """The colour of a variant: its schedule's (the longest SCHEDULE_COLORS key it starts with), else
    one of the colours no schedule uses, by its rank among ``others``."""
    stem = str(name)
    for schedule in sorted(SCHEDULE_COLORS, key=len, reverse=True):
        if stem == schedule or stem.startswith((f"{schedule}-", f"{schedule}+")):
            return SCHEDULE_COLORS[schedule]
    rank = sorted(map(str, others)).index(stem) if stem in map(str, others) else 0
    return SPARE_COLORS[rank % len(SPARE_COLORS)]


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` (PNG) and to the PDF beside it, each through a temporary file renamed into
    place, then close it. No "Software" tag: it carries matplotlib's URL, and the report embeds no links."""
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}))
    atomic_write(path.with_suffix(".pdf"), lambda tmp: fig.savefig(tmp, format="pdf", metadata={"Creator": None}))
    pyplot().close(fig)
