"""One-unroll evaluation grid (SPEC §5) and its metrics."""
