"""The cells: the grid, the guarded worker processes that run each configuration, variants and rollouts."""
