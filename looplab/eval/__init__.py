"""One-unroll evaluation grid (docs/methods.md §5) and its metrics."""
