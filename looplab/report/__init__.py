"""Sweep report (docs/methods.md §5): seed statistics, paper side-by-side tables, figures and one HTML page.

aggregate  mean, sample std, bootstrap interval over seeds per (group, metric)
runs       results.parquet and the runs' eval files as stacked frames
tables     display cells and numeric columns of a table
render     Markdown / LaTeX / HTML renderings of a table
paper      our numbers beside a paper's CSV tables (read at report time)
plots      figures per task
html       the self-contained report.html
build      write_report, which ties them together
"""

from looplab.report.build import write_report
from looplab.report.paper import PAPERS

__all__ = ["write_report", "PAPERS"]
