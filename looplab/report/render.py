"""Render :class:`~looplab.report.tables.Table` display frames as Markdown, LaTeX and HTML.

Small hand-written renderers: pandas' own need optional packages (tabulate,
jinja2) that looplab does not depend on, and every cell is already a string.
"""

from __future__ import annotations

import html
import re

from looplab.report.tables import Table

_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "–": "--",
    "→": r"$\to$",
    "<": r"$<$",
    ">": r"$>$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
}
_LATEX_SPECIAL = re.compile("|".join(map(re.escape, _LATEX)))


def latex_escape(text: str) -> str:
    return _LATEX_SPECIAL.sub(lambda m: _LATEX[m.group()], text)


def _markdown_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", r"\|") for c in cells) + " |"


def to_markdown(tables: list[Table], title: str, notes: list[str]) -> str:
    """One Markdown document: a heading, the notes as a list, then each table under its title."""
    lines = [f"# {title}", "", *[f"- {note}" for note in notes], ""]
    for table in tables:
        lines += [f"## {table.title}", ""]
        if table.note:
            lines += [table.note, ""]
        frame = table.display
        lines += [_markdown_row(frame.columns), _markdown_row(["---"] * len(frame.columns))]
        lines += [_markdown_row(row) for row in frame.itertuples(index=False, name=None)]
        lines.append("")
    return "\n".join(lines)


def to_latex(tables: list[Table]) -> str:
    """One ``table`` float per table (booktabs rules), ready to \\input into a paper.

    Each tabular sits in an ``adjustbox`` of at most the line width: a table wider than
    the text column is scaled down to fit it, a narrower one is left as it is.
    """
    lines = [r"% looplab report tables; needs \usepackage{booktabs} and \usepackage{adjustbox}"]
    for table in tables:
        frame = table.display
        lines += [
            r"\begin{table}[ht]",
            r"\centering",
            r"\small",
            rf"\caption{{{latex_escape(table.title)}}}",
            r"\begin{adjustbox}{max width=\linewidth}",
            rf"\begin{{tabular}}{{{'l' * len(frame.columns)}}}",
            r"\toprule",
            " & ".join(latex_escape(str(c)) for c in frame.columns) + r" \\",
            r"\midrule",
        ]
        lines += [
            " & ".join(latex_escape(str(c)) for c in row) + r" \\" for row in frame.itertuples(index=False, name=None)
        ]
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{adjustbox}", r"\end{table}", ""]
    return "\n".join(lines)


# where a cell may wrap: around " / " and before " → " (ours / paper → verdict), and after a comma that
# ends a phrase ("RL-Halting, T_max = 20"); every other space holds its neighbours together, so
# "36.0 [21.1, 50.9]" or "3 (few)" never breaks
_BREAK = re.compile(r" (?=/ |→ )|(?<= /) |(?<=,) (?=[^\d\s−+-])")


def html_cell(text: str) -> str:
    """``text`` escaped for HTML, its spaces non-breaking except where :data:`_BREAK` allows a line break."""
    parts = _BREAK.split(str(text))
    return " ".join(html.escape(part).replace(" ", "&nbsp;") for part in parts)


def to_html_table(table: Table) -> str:
    """A ``<table>`` element (escaped) for one table, preceded by its note."""
    frame = table.display
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html_cell(c)}</td>" for c in row) + "</tr>"
        for row in frame.itertuples(index=False, name=None)
    )
    note = f'<p class="note">{html.escape(table.note)}</p>\n' if table.note else ""
    return f"{note}<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"
