"""Stability toolkit (docs/methods.md §6): the loop Jacobian, JSRR, spectral radius, test-time scaling."""
