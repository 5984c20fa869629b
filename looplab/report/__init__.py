"""Sweep report (docs/methods.md §5): seed statistics, paper side-by-side tables, figures and one HTML page.

aggregate   mean, sample std, the mean's t-interval and the std's bootstrap interval per (group, metric)
runs        results.parquet and the runs' eval files as stacked frames
tables      display cells and numeric columns of a table
render      Markdown / LaTeX / HTML renderings of a table
comparison  one table of our statistics beside a paper CSV's rows
paper       which of our groups matches which paper row, per paper (read at report time)
stopping    the stopping comparison's protocols, variant names, scale-free ratios and conclusions
effect      the stopping study's effect test
halting     whether a learned halting policy collapsed to shallow depths
plots       figures per task, with their captions
html        the self-contained report.html
build       write_report, which ties them together
"""

from looplab.report.build import write_report
from looplab.report.paper import PAPERS

__all__ = ["write_report", "PAPERS"]
