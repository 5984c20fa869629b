"""The report engine (docs/methods.md §5): seed statistics, paper side-by-side tables, figures, one HTML page,
and the committed results pages. It names no study: the studies (:mod:`looplab.studies`) register their
papers, page blocks and collectors with it.

aggregate   mean, sample std, the mean's t-interval and the std's bootstrap interval per (group, metric)
runs        results.parquet and the runs' eval files as stacked frames
variants    what a row's schedule says of itself: its label and training depth
tables      display cells and numeric columns of a table
render      Markdown / LaTeX / HTML renderings of a table
comparison  one table of our statistics beside a paper CSV's rows
paper       the registry of papers, with hooks for their tables, figures and captions
effect      two-arm tests: Welch, F, Brown–Forsythe and bootstrap intervals, and the effect rule
plots       figures per task, with their captions
html        the self-contained report.html
build       write_report, which ties them together
pages       the results pages' generated blocks, their collectors, and checked reads of their CSVs
"""

from looplab.report.build import write_report
from looplab.report.paper import PAPERS

__all__ = ["write_report", "PAPERS"]
