"""A paper entry: ``looplab report DIR --paper oracle_only`` sets each group's Oracle OOD apart, with its seeds.

A real paper's ``tables`` reads the paper's CSV from ``tables_dir`` and pairs its rows with our groups
(:func:`looplab.report.comparison.compare_table`); this one shows the shape of the entry alone.
"""

from looplab.report.paper import Paper, register_paper
from looplab.report.tables import seed_table


def oracle_tables(ours, tables_dir):
    long = ours.long[ours.long["metric"] == "oracle_ood"]
    return [seed_table("Ours: Oracle OOD by group", ours.groups, long, ours.by)], []


register_paper(Paper("oracle_only", "Oracle OOD alone (an example paper entry)", oracle_tables))
