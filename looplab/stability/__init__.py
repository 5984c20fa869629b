"""Stability toolkit (SPEC §6): the loop Jacobian, JSRR, spectral radius, test-time scaling."""
