"""Do two runs of the same model give the same outputs, cell by cell, timings aside?

    .venv/bin/python bench/same_outputs.py BEFORE AFTER

BEFORE and AFTER are results.json files (or report folders holding one), e.g. a
run of a bundled policy on the commit before a refactor and on the one after.
Both are read through `matrix.results.load`, so a version-1 file is compared in
version 2's names. Timings are left out (latency, cold start, durations,
conversion time, a rollout's time per step, a fix attempt's p50, the time-boxed
latency notes, the decision, which prefers the fastest) and placement is compared as a set of rows (tract lists its nodes in
no fixed order); everything else must be equal: verdicts, reasons, parity, contract,
placement, backend, artifact sizes, op inventories, rollouts. Exit 1 when any
cell differs or a cell is in one run only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matrix import results as schema  # noqa: E402
from matrix.decide.merge import shard_path  # noqa: E402

TIMING_FIELDS = ("latency", "cold_start_ms", "duration_s")
TIMING_NOTE = "latency at batch"  # "...: 12 of 200 calls timed within the 30 s budget"


def comparable(cell: schema.Cell) -> dict:
    """The cell without what depends on the clock or the machine's load."""
    data = cell.model_dump(mode="json", exclude=set(TIMING_FIELDS))
    if data.get("artifact"):
        data["artifact"].pop("conversion_s", None)
    data["notes"] = [note for note in data["notes"] if not note.startswith(TIMING_NOTE)]
    if data.get("rollout"):
        data["rollout"].pop("step_us", None)  # wall time per step
    for fix in data["fixes"]:
        fix.pop("p50_us", None)  # a fix attempt's own latency
    # Some runtimes list their nodes in no fixed order (tract's profile): placement is a set of rows.
    data["placement"] = sorted(data["placement"], key=lambda row: json.dumps(row, sort_keys=True))
    return data


def differences(before, after, path: str = "") -> list[str]:
    """Where two JSON-like values differ, as 'path: before -> after' lines."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [line for key in sorted(set(before) | set(after), key=str)
                for line in differences(before.get(key, "<absent>"), after.get(key, "<absent>"), f"{path}.{key}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [line for i, (b, a) in enumerate(zip(before, after)) for line in differences(b, a, f"{path}[{i}]")]
    return [] if before == after else [f"{path.lstrip('.')}: {before!r} -> {after!r}"]


def compare(before: schema.RunResults, after: schema.RunResults) -> tuple[list[str], int]:
    """(difference lines, number of cells compared)."""
    old = {cell.key: comparable(cell) for cell in before.cells}
    new = {cell.key: comparable(cell) for cell in after.cells}
    lines = [f"{' '.join(filter(None, key))}: only in {'BEFORE' if key in old else 'AFTER'}"
             for key in sorted(set(old) ^ set(new))]
    for key in sorted(set(old) & set(new)):
        lines += [f"{' '.join(filter(None, key))}: {line}" for line in differences(old[key], new[key])]
    if before.model.get("sha256") != after.model.get("sha256"):
        lines.insert(0, "the two runs measured different models")
    return lines, len(set(old) & set(new))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    before, after = (schema.load(shard_path(Path(arg))) for arg in argv)
    lines, compared = compare(before, after)
    for line in lines:
        print(line)
    print(f"{compared} cells compared: {'same outputs' if not lines else f'{len(lines)} differences'}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
