"""bench/same_outputs.py: two runs compared cell by cell, timings aside (the refactor's acceptance check)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from saved import FIXTURES
from matrix import results as schema

_SPEC = importlib.util.spec_from_file_location("same_outputs", Path(__file__).parents[2] / "bench" / "same_outputs.py")
same_outputs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(same_outputs)

V1 = FIXTURES / "results_v1_continuous_mlp.json"


def test_timings_differ_yet_the_outputs_are_the_same():
    before, after = schema.load(V1), schema.load(V1)
    cell = after.cells[0]
    cell.latency[0].p50_us *= 3
    cell.duration_s, cell.cold_start_ms, cell.artifact.conversion_s = 99.0, 99.0, 99.0
    cell.notes.append("latency at batch 64: 3 of 200 calls timed within the 30 s budget")
    assert same_outputs.compare(before, after) == ([], len(before.cells))


def test_a_changed_drift_verdict_or_missing_cell_is_named():
    before, after = schema.load(V1), schema.load(V1)
    after.cells[0].parity[0].max_abs += 1e-9
    after.cells[0].verdict = "WARN"
    lines, _ = same_outputs.compare(before, after)
    assert any(".max_abs:" in line for line in lines) and any("verdict: 'PASS' -> 'WARN'" in line for line in lines)
    after.cells.pop()
    lines, compared = same_outputs.compare(before, after)
    assert compared == len(before.cells) - 1 and any(line.endswith("only in BEFORE") for line in lines)
