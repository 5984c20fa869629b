"""report.html: one self-contained page — tables inline, every figure a base64 ``data:`` URI.

No scripts, stylesheets, fonts or links to fetch: the file can be mailed or
archived and still shows everything.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from looplab.report.render import to_html_table
from looplab.report.tables import Table

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; white-space: nowrap; }
th { background: #f3f3f3; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1em 0 2em; }
img { max-width: 100%; }
.note { color: #555; font-size: 0.9em; }
"""


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def to_html(title: str, notes: list[str], tables: list[Table], figures: list[Path]) -> str:
    """The page: title, notes, each table under its heading, then each figure captioned with its file name."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if notes:
        parts.append('<ul class="note">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    for table in tables:
        parts += [f"<h2>{html.escape(table.title)}</h2>", to_html_table(table)]
    if figures:
        parts.append("<h2>Figures</h2>")
    for path in figures:
        parts.append(
            f'<figure><img alt="{html.escape(path.stem)}" src="{png_data_uri(path)}">'
            f'<figcaption class="note">{html.escape(path.name)}</figcaption></figure>'
        )
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)
