"""Exit 1 says why, even under -q ("only errors"): a CI log that shows only the exit code left the reader to open
the report to learn whether a cell FAILed, --fail-on warn caught a WARN, or the baseline found a regression."""

from __future__ import annotations

from conftest import run_cli
from saved import FIXTURES

from matrix import results as schema


def test_quiet_says_in_one_line_why_the_exit_code_is_1(tmp_path):
    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    for cell, verdict in zip(shard.cells, ["FAIL", "WARN"]):
        cell.verdict = verdict
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "results.json").write_text(shard.model_dump_json())
    done = run_cli("-q", "merge", tmp_path / "shard", "--out", tmp_path / "merged", "--fail-on", "warn")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == ["policy-matrix: exit 1: 2 cells: 1 FAIL, 1 WARN (--fail-on warn)"]
