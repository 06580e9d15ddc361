"""The lines a guarded process prints on its stdout: one JSON object each, the stage it enters (and how far it is
within one). Part of the cell protocol (matrix/run/protocol.py, which uses them too), kept apart from its records:
a job that only reports stages (the reference job, the tool's steps) then never builds the results' schemas
(0.1-0.2 s), which it would have to do itself when the fork server has not loaded them yet."""

from __future__ import annotations

import json

START = "start"  # before the process reported any stage


def stage_message(name: str, progress: str = "") -> str:
    """The line a worker prints when it enters a stage (and how far it is within one, e.g. episodes)."""
    return json.dumps({"stage": name, **({"progress": progress} if progress else {})})


def read_message(line: str) -> dict | None:
    """A protocol line as a dict; None for anything else a runtime printed to stdout."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
