"""Schedules, objectives, checkpoints and the training loop."""

from looplab.train import halting  # noqa: F401  (registers rl_halting and pondernet)
