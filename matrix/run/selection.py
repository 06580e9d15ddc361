"""Which targets a run covers: names or shell-style globs (`ort-web-*`), minus `--skip` globs.

A name or glob may carry a release, `ort-cpu@1.20.1` or `ort-web-*@1.22.0`: each target it
matches is run at that release too (targets/versions.py); no suffix is the project's default.
"""

from __future__ import annotations

import fnmatch

from ..errors import InputError


def _patterns(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _matching(pattern: str, known: list[str], option: str) -> list[str]:
    found = fnmatch.filter(known, pattern)
    if not found:
        problem = "no target matches" if any(char in pattern for char in "*?[") else "unknown target"
        raise InputError(f"{option}: {problem} {pattern!r}; known: {', '.join(known)}")
    return found


def _matching_labels(pattern: str, known: list[str], option: str) -> list[str]:
    """Targets a pattern matches, each with the pattern's @release when it has one."""
    names, pinned_to, version = pattern.partition("@")
    return [f"{name}{pinned_to}{version}" for name in _matching(names, known, option)]


def select_targets(spec: str, skip: str, known: list[str], option: str = "--targets") -> list[str]:
    """Targets `spec` names ('all', names, globs; in the order given) that no `skip` glob matches.
    `option` is the flag `spec` came from, so an unknown name is reported against it."""
    wanted = known if spec.strip() == "all" else [n for p in _patterns(spec) for n in _matching_labels(p, known, option)]
    skipped = {name for pattern in _patterns(skip) for name in _matching_labels(pattern, known, "--skip")}
    chosen = [name for name in dict.fromkeys(wanted) if name not in skipped]
    if not chosen:
        raise InputError(f"--targets {spec!r} --skip {skip!r} leaves no target to run")
    return chosen
