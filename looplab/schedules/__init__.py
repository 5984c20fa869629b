"""Training-depth schedules (docs/methods.md §3, §4): the contract, the registry and every built-in schedule.

``base.py`` states the contract a schedule meets; ``rules.py`` holds the rule
schedules (fixed, matched, window, fixed_window, multi_depth, lognormal,
poisson_lognormal) and ``halting.py`` the learned ones (rl_halting, pondernet).
"""

from looplab.schedules import halting, rules  # noqa: F401,E402  (importing registers the built-in schedules)
from looplab.schedules.base import (
    SCHEDULES,
    ConstantDepth,
    DepthRule,
    DepthWindow,
    Schedule,
    ScheduleContext,
    StepOutput,
    depth_stats,
    make_schedule,
    register_schedule,
    resolve_schedule,
    schedule_params,
)
from looplab.schedules.halting import HaltingSample, PonderNet, RLHalting  # noqa: E402

__all__ = [
    "SCHEDULES",
    "ConstantDepth",
    "DepthWindow",
    "DepthRule",
    "HaltingSample",
    "PonderNet",
    "RLHalting",
    "Schedule",
    "ScheduleContext",
    "StepOutput",
    "depth_stats",
    "make_schedule",
    "register_schedule",
    "resolve_schedule",
    "schedule_params",
]
