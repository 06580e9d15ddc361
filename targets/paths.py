"""Where policy-matrix keeps files that outlive a run (here, in the lower of the two packages: `matrix` and
`targets` both use it, and `targets` never imports `matrix`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Content-hash cache for converted artifacts and isolated environments.

    POLICY_MATRIX_CACHE overrides the default (XDG cache directory).
    """
    root = os.environ.get("POLICY_MATRIX_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "policy-matrix"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
