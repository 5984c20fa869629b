"""Headless matplotlib for every figure looplab writes, in one style.

Every figure is drawn with the same sizes and fonts (:data:`STYLE`), gives each
schedule the same colour in every figure (:func:`color_for`), and is saved by
:func:`save_figure` as a PNG (for reports) with a PDF beside it (vector, for papers).

A figure preset (:data:`FIGURE_PRESETS`, ``--figsize`` on the commands that draw)
sets the fonts and the width every figure is saved at: ``screen`` keeps each
figure's own size; ``paper`` saves a one-panel figure one column wide (3.25 in)
and a wider one two columns wide (6.75 in), all text at least 7 pt at that size,
so a figure included at its own width is never scaled; ``slide`` is 10 in wide
with text from 14 pt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from looplab.errors import choice_error
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


@dataclass(frozen=True)
class FigurePreset:
    """Fonts (matplotlib rcParams, points) and widths (inches) every figure is saved at.

    ``widths`` is (one panel, several panels); None keeps each figure's own size. A figure keeps its
    aspect, but is never less than ``min_height`` tall (a wide strip would leave no room for its labels).
    """

    fonts: dict = field(default_factory=dict)
    widths: tuple[float, float] | None = None
    min_height: float = 0.0

    @property
    def rc(self) -> dict:
        """The rcParams it sets: its fonts, and with widths, the saved box is the figure (not grown to
        its contents or cropped to them)."""
        return {**self.fonts, **({"savefig.bbox": "standard"} if self.widths is not None else {})}


def _fonts(base: float) -> dict:
    """rcParams with text at ``base`` points and titles a point larger (none below ``base``)."""
    return {
        "font.size": base,
        "axes.labelsize": base,
        "legend.fontsize": base,
        "legend.title_fontsize": base,
        "xtick.labelsize": base,
        "ytick.labelsize": base,
        "axes.titlesize": base + 1,
        "figure.titlesize": base + 1,
    }


FIGURE_PRESETS = {
    "screen": FigurePreset(),
    "paper": FigurePreset(_fonts(7), (3.25, 6.75), min_height=2.2),
    "slide": FigurePreset(_fonts(14), (10.0, 10.0), min_height=4.5),
}
_preset = FIGURE_PRESETS["screen"]


def figure_preset() -> FigurePreset:
    """The preset later figures are drawn and saved with."""
    return _preset


def use_figure_preset(name: str) -> None:
    """Draw and save every later figure of this process with the preset ``name``."""
    global _preset
    if name not in FIGURE_PRESETS:
        raise choice_error("figure size", name, FIGURE_PRESETS)
    _preset = FIGURE_PRESETS[name]


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
    plt.rcParams.update(_preset.rc)
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


def fit_preset(fig) -> None:
    """Resize ``fig`` to the active preset's width (its aspect kept; one panel or several), its layout
    redone inside that size and no text below the preset's size. Nothing changes under ``screen``."""
    if _preset.widths is None:
        return
    panels = [ax for ax in fig.axes if ax.get_visible() and getattr(ax, "_colorbar", None) is None]
    width = _preset.widths[0] if len(panels) <= 1 else _preset.widths[1]
    old_width, old_height = fig.get_size_inches()
    fig.set_size_inches(width, max(old_height * width / old_width, _preset.min_height))
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    for text in fig.findobj(lambda artist: hasattr(artist, "get_fontsize") and hasattr(artist, "set_fontsize")):
        if text.get_fontsize() < _preset.fonts["font.size"]:  # "small" legends and the like: up to the floor
            text.set_fontsize(_preset.fonts["font.size"])


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` (PNG) and to the PDF beside it, each through a temporary file renamed into
    place, then close it. No "Software" tag: it carries matplotlib's URL, and the report embeds no links."""
    path = Path(path)
    fit_preset(fig)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}))
    atomic_write(path.with_suffix(".pdf"), lambda tmp: fig.savefig(tmp, format="pdf", metadata={"Creator": None}))
    pyplot().close(fig)
