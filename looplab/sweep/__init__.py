"""Sweeps: a grid of (config × overrides × seeds), each point trained and evaluated in its own run dir."""

from looplab.sweep.results import RESULTS_FILE, flatten, write_results
from looplab.sweep.run_point import PointJob, run_point
from looplab.sweep.runner import BACKENDS, SweepIncomplete, run_sweep
from looplab.sweep.spec import RunPoint, SweepSpec, config_id, load_sweep

__all__ = [
    "BACKENDS",
    "RESULTS_FILE",
    "PointJob",
    "RunPoint",
    "SweepIncomplete",
    "SweepSpec",
    "config_id",
    "flatten",
    "load_sweep",
    "run_point",
    "run_sweep",
    "write_results",
]
