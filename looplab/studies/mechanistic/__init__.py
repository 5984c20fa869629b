"""The mechanistic paper: the paper beside our sweeps (paper), the init grid (grid), the trained-model study
(trained, traces), the trained retrofit (trained_retrofit) and the SmolLM2 scripts (smollm2_*)."""
