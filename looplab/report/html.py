"""report.html: one self-contained page that reads like a results section.

A summary first (the conclusions), then how to read the numbers, then each
table followed by its figures, each figure captioned with what it plots and
what its bands are. Table cells wrap only between the parts of a cell
(:func:`looplab.report.render.html_cell`), and a table scrolls inside its own
box when still too wide, so nothing runs off the page at any width. No scripts,
stylesheets, fonts or links to fetch: every figure is a base64 ``data:`` URI,
and the file can be mailed or archived and still shows everything.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from looplab.report.render import to_html_table
from looplab.report.tables import Table

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222;
       line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; } h3 { font-size: 1em; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1em; }
table { border-collapse: collapse; font-size: 0.8em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.45em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1em 0 2em; }
img { max-width: 100%; height: auto; }
figcaption, .note { color: #555; font-size: 0.88em; }
.summary { background: #f6f8fa; border-left: 4px solid #4a7; padding: 0.5em 1em; }
"""


@dataclass
class Section:
    """A table and the figures that go with it (either may be absent)."""

    table: Table | None
    figures: list[tuple[Path, str]] = field(default_factory=list)  # (PNG, caption)


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _list(items: list[str], css: str) -> str:
    return f'<ul class="{css}">' + "".join(f"<li>{html.escape(item)}</li>" for item in items) + "</ul>"


def to_html(title: str, summary: list[str], notes: list[str], sections: list[Section]) -> str:
    """The page: title, summary, how to read it, then every section's table and figures."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if summary:
        parts += ["<h2>Summary</h2>", _list(summary, "summary")]
    if notes:
        parts += ["<h2>How to read this report</h2>", _list(notes, "note")]
    for section in sections:
        if section.table is not None:
            parts += [
                f"<h2>{html.escape(section.table.title)}</h2>",
                f'<div class="scroll">{to_html_table(section.table)}</div>',
            ]
        for path, caption in section.figures:
            parts.append(
                f'<figure><img alt="{html.escape(path.stem)}" src="{png_data_uri(path)}">'
                f"<figcaption><b>{html.escape(path.stem)}.</b> {html.escape(caption)} "
                f"(vector copy: {html.escape(path.with_suffix('.pdf').name)})</figcaption></figure>"
            )
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)
