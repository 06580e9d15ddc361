"""What CI reads must not lie: compare refuses other models, one host's disjoint shards
merge, overlapping cells do not, and regressions are failed test cases in junit.xml."""

from __future__ import annotations

import os
import subprocess
import sys
from xml.etree import ElementTree as ET

import pytest
from conftest import load_results, run_cli

from matrix import results as schema
from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    out = tmp_path_factory.mktemp("shard")
    done = run_cli("run", example("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp32,fp16", "--iters", "5",
                   "--host-label", "ci-linux", "--out", out)
    assert done.returncode == 0, done.stderr
    return schema.load(out / "results.json")


def _save(results: schema.RunResults, folder) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    results.save(folder / "results.json")
    return str(folder)


def test_compare_refuses_results_of_another_model(shard, tmp_path, policy_matrix):
    other = shard.model_copy(deep=True)
    other.model = {**other.model, "sha256": "0" * 64, "name": "other_policy.onnx"}
    done = policy_matrix(["compare", "--baseline", _save(shard, tmp_path / "a"), "--current", _save(other, tmp_path / "b")])
    assert done.returncode == 2 and "compare runs of the same model" in "\n".join(done.lines), done.lines
    assert "no regressions" not in "\n".join(done.lines)


def test_one_hosts_disjoint_shards_merge_and_overlapping_ones_do_not(shard, tmp_path, policy_matrix):
    fp32, fp16 = shard.model_copy(deep=True), shard.model_copy(deep=True)
    fp32.cells, fp16.cells = shard.cells[:1], shard.cells[1:]
    done = policy_matrix(["merge", _save(fp32, tmp_path / "a"), _save(fp16, tmp_path / "b"), "--out", tmp_path / "merged"])
    assert done.returncode == 0, done.lines
    merged = load_results(tmp_path / "merged")
    assert [h["label"] for h in merged["hosts"]] == ["ci-linux"]
    assert [(c["host"], c["variant"]) for c in merged["cells"]] == [("ci-linux", "fp32"), ("ci-linux", "fp16")]

    done = policy_matrix(["merge", tmp_path / "a", _save(shard, tmp_path / "all"), "--out", tmp_path / "overlap"])
    assert done.returncode == 2 and "cell ort-cpu fp32 of host 'ci-linux' is in both" in "\n".join(done.lines), done.lines


def test_junit_names_cells_and_fails_regressions(shard, tmp_path, policy_matrix):
    worse = shard.model_copy(deep=True)
    worse.cells[1].verdict, worse.cells[1].reasons = "FAIL", ["injected failure"]
    done = policy_matrix(["merge", _save(worse, tmp_path / "worse"), "--baseline", _save(shard, tmp_path / "base"),
                          "--out", tmp_path / "report", "--fail-on", "never"])
    assert done.returncode == 1, done.lines
    suite = ET.parse(tmp_path / "report" / "junit.xml").getroot().find("testsuite")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert {"ort-cpu fp32", "ort-cpu fp16", "ort-cpu fp16 regression: verdict"} <= set(cases)
    assert cases["ort-cpu fp16 regression: verdict"].find("failure") is not None
    assert suite.get("failures") == "2" and suite.get("tests") == "3"  # the FAILed cell and its regression


def test_a_reader_that_goes_away_leaves_the_run_whole_and_its_own_exit_status(tmp_path):
    """`policy-matrix run … 2>&1 | head -1`: head leaves after a line, the run's next write raised BrokenPipeError,
    and it ended with exit 1 (what CI reads as a FAILed cell) before writing results.json or the report. A reader
    going away is neither: the run finishes, writes everything, and exits with its own status."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # a real pipe whose reader is gone before the first line
    try:
        done = subprocess.run([sys.executable, "-m", "matrix", "run", example("continuous_mlp"), "--targets", "ort-cpu",
                               "--variants", "fp32,fp16", "--iters", "5", "--out", tmp_path],
                              stdout=write_end, stderr=write_end, timeout=600)
    finally:
        os.close(write_end)
    assert done.returncode == 0
    assert [cell["verdict"] for cell in load_results(tmp_path)["cells"]] == ["PASS", "PASS"]
    assert (tmp_path / "index.html").read_text().rstrip().endswith("</html>")
    assert "PASS 2" in (tmp_path / "summary.md").read_text()
