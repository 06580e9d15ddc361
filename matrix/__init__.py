"""policy-matrix: a cross-runtime compatibility matrix for exported RL policies."""

__version__ = "0.1.0"
