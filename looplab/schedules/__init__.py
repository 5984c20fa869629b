"""Training-depth schedules (docs/methods.md §3, §4): the contract, the registry and every built-in schedule.

``base.py`` states the contract a schedule meets; ``rules.py`` holds the rule
schedules (fixed, matched, window, fixed_window, multi_depth, lognormal,
poisson_lognormal), ``halting.py`` the learned ones (rl_halting, pondernet) and
``segment_halting.py`` those that halt between deep-supervision segments
(act_bce, q_halt; the segmented unroll itself is ``segments.py``).
"""

from looplab.schedules import halting, rules, segment_halting  # noqa: F401,E402  (importing registers the built-in schedules)
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
from looplab.schedules.segment_halting import ActBCE, QHalt, SegmentHalting  # noqa: E402

__all__ = [
    "SCHEDULES",
    "ActBCE",
    "QHalt",
    "SegmentHalting",
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
