"""Resume after a full disk: the journal drops a line cut short, and cells that failed on the tool's
own I/O run again instead of being kept as FAIL."""

from __future__ import annotations

import json

from rich.console import Console

from matrix.run import cells
from matrix.configuration import Configuration
from matrix.run.orchestrate import Journal
from matrix.results import Cell, CellError

STAMP = {"run_id": "r1", "model_sha256": "a" * 64}


def _line(variant: str, verdict: str = "PASS", error: str | None = None) -> str:
    cell = Cell(host="h", target="ort-cpu", variant=variant, verdict=verdict,
                error=CellError(stage="run", message=error) if error else None)
    return json.dumps({**STAMP, **cell.model_dump(mode="json")}) + "\n"


def test_a_cut_line_is_dropped_before_the_next_append(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(_line("fp32") + _line("fp16")[:40])  # the disk filled mid-line
    journal = Journal(path, STAMP["run_id"], STAMP["model_sha256"], Console(quiet=True))
    journal.append(Cell(host="h", target="ort-cpu", variant="int8", verdict="PASS"))
    lines = [json.loads(raw) for raw in path.read_text().splitlines()]  # every line whole: none glued on
    assert [line["variant"] for line in lines] == ["fp32", "int8"]
    assert set(Journal.finished(path, STAMP["run_id"], STAMP["model_sha256"])) == {
        Configuration("ort-cpu", "fp32").key, Configuration("ort-cpu", "int8").key}


def test_cells_failed_by_the_disk_run_again_and_runtime_failures_are_kept(tmp_path):
    disk = cells.name_tool_io("OSError: [Errno 28] No space left on device: 'outputs.npz'")
    assert disk.startswith("the tool could not write its files (ENOSPC: No space left on device)")
    path = tmp_path / "results.jsonl"
    path.write_text(_line("fp32") + _line("fp16", "FAIL", disk) + _line("int8", "FAIL", "open: no kernel for MatMulInteger"))
    finished = Journal.finished(path, STAMP["run_id"], STAMP["model_sha256"])
    assert sorted(cell.variant for cell in finished.values()) == ["fp32", "int8"]


def test_a_worker_that_died_silently_on_a_full_disk_is_named_by_a_probe_write(tmp_path):
    read_only = tmp_path / "missing" / "cell"  # a write there fails, but not with a disk errno
    assert cells.name_tool_io("exited with code 1", read_only) == "exited with code 1"
    assert cells.name_tool_io("exited with code 1", tmp_path) == "exited with code 1"  # the disk takes writes
    assert cells.name_tool_io("OSError: [Errno 30] Read-only file system").startswith(
        "the tool could not write its files (EROFS")
