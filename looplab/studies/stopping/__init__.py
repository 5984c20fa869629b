"""Learned Stochastic Stopping: the paper beside our sweeps (paper), its protocol and conclusions (protocol),
whether a learned halting policy collapsed (halting), and the confirmation study (confirm)."""
