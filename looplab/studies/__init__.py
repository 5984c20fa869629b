"""The studies looplab ran, beside the library: each study's protocol constants, collector, page blocks,
paper description and scripts, in one folder per study.

    stopping/     Learned Stochastic Stopping: the paper's comparison, the confirmation study
    stars/        STARS: the paper's comparison, the looped-LM, fine-tune, retrofit and stabiliser studies
    mechanistic/  the mechanistic paper: its comparison, the grid, trained-model and SmolLM2 studies
    recursive/    TRM and HRM: the comparison and the recursive-reasoner pages
    earlier.py    blocks of the earlier pages, computed from the seed aggregates committed beside them
    earlier_paper.py  the earlier pages beside their papers (their "Ours vs paper" blocks)

The dependency is one way: a study imports the engine (:mod:`looplab.report`) and the library below
it; nothing in the library imports a study. A study registers its paper, page blocks and
collectors on import; :func:`load_studies` imports them all, and the command line calls it only
for the commands that need them (``report``, ``reproduce``, ``results``).
"""

from __future__ import annotations

import importlib

#: the modules that register something (a paper, page blocks, a collector) when imported
REGISTERING = (
    "looplab.studies.earlier",
    "looplab.studies.earlier_paper",
    "looplab.studies.stopping.paper",
    "looplab.studies.stopping.confirm",
    "looplab.studies.stopping.verdicts",
    "looplab.studies.stopping.pilot",
    "looplab.studies.stars.paper",
    "looplab.studies.stars.finetune",
    "looplab.studies.stars.retrofit",
    "looplab.studies.stars.stabilisers",
    "looplab.studies.mechanistic.paper",
    "looplab.studies.mechanistic.grid",
    "looplab.studies.mechanistic.trained",
    "looplab.studies.mechanistic.verdicts",
    "looplab.studies.mechanistic.says",
    "looplab.studies.mechanistic.trained_retrofit",
    "looplab.studies.mechanistic.traces",
    "looplab.studies.recursive.paper",
    "looplab.studies.recursive.pages",
    "looplab.studies.recursive.verdicts",
    "looplab.studies.recursive.says",
    "looplab.studies.flat_cache",
    "looplab.studies.flat_cache_view",
    "looplab.studies.flat_cache_confirm",
)
#: reproduction studies with a part that is not a sweep of configs: its settings file, run after the sweep
STUDY_EXTRAS = {"stars-lm": "stars-lm/retrofit.toml"}


def load_studies() -> None:
    """Import every study, so that its paper, page blocks and collectors are registered (idempotent)."""
    for module in REGISTERING:
        importlib.import_module(module)
