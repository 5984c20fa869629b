"""The training loop, data-parallel training and its helpers."""
