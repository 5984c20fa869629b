"""Schedules, objectives, checkpoints and the training loop."""
