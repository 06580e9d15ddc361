"""What the CLI prints for machines (--json), for people (escaped hints, -q/-v), and which settings win."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import targets as registry
from matrix.inputs import examples
from matrix.cli.cli import app

from conftest import load_results, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.coreml_env]

MLP = examples.path("continuous_mlp")


def run_in(cwd, *args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The CLI from another folder (config discovery reads the current folder)."""
    return subprocess.run([sys.executable, "-m", "matrix", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})


def test_targets_json_lists_every_target_with_its_status():
    done = run_cli("targets", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [row["name"] for row in rows] == list(registry.REGISTRY)
    for row in rows:
        assert row["available"] == (row["reason"] is None)
    assert next(row for row in rows if row["name"] == "ort-cpu")["available"]


def test_targets_table_shows_hints_with_brackets_literally(monkeypatch):
    hint = "pip install 'policy-matrix[tract]' or [tflite]"
    monkeypatch.setattr(type(registry.get("tract")), "unavailable_reason", lambda self: hint)
    done = CliRunner().invoke(app, ["targets"], terminal_width=300)
    assert done.exit_code == 0, done.output
    assert "policy-matrix[tract]" in done.output and "[tflite]" in done.output


def test_coreml_needs_setup_until_its_environment_is_built(tmp_path):
    empty_cache = {"POLICY_MATRIX_CACHE": str(tmp_path / "cache")}
    rows = {row["name"]: row for row in json.loads(run_in(tmp_path, "targets", "--json", env=empty_cache).stdout)}
    assert not rows["coreml"]["available"]
    assert "policy-matrix setup coreml" in rows["coreml"]["reason"]
    done = run_in(tmp_path, "run", MLP, "--targets", "coreml", "--precisions", "fp32", "--out", tmp_path / "out",
                  env=empty_cache)
    assert done.returncode == 0, done.stderr
    cell = load_results(tmp_path / "out")["cells"][0]
    assert cell["verdict"] == "SKIP" and "needs setup" in cell["reasons"][0]
    assert not list((tmp_path / "cache").glob("envs/coreml-*")), "the first cell must not build the environment"


def test_coreml_is_available_once_set_up():
    rows = {row["name"]: row for row in json.loads(run_cli("targets", "--json").stdout)}
    assert rows["coreml"]["available"], rows["coreml"]["reason"]  # `make setup` built it


def test_lint_json_is_the_lint_list(policy_matrix):
    done = policy_matrix(["lint", "--json", MLP])
    assert done.returncode == 0, done.stderr
    lints = json.loads(done.stdout)
    assert {"input-obs", "output-action", "symbolic-batch"} <= {item["id"] for item in lints}
    assert all(item["level"] in ("ok", "warn", "error") and item["message"] for item in lints)


def test_compare_json_lists_regressions(ort_cpu_runs, tmp_path, policy_matrix):
    run = ort_cpu_runs["continuous_mlp"]
    same = policy_matrix(["compare", "--json", "--baseline", run, "--current", run])
    assert same.returncode == 0 and json.loads(same.stdout) == []
    worse = load_results(run)
    worse["cells"][0]["verdict"] = "FAIL"
    (tmp_path / "results.json").write_text(json.dumps(worse))
    done = policy_matrix(["compare", "--json", "--baseline", run, "--current", tmp_path / "results.json"])
    assert done.returncode == 1
    found = json.loads(done.stdout)
    assert [(r["target"], r["variant"], r["kind"]) for r in found] == [("ort-cpu", worse["cells"][0]["variant"], "verdict")]


def test_compare_json_still_says_what_it_did_not_compare(ort_cpu_runs, tmp_path, policy_matrix):
    """An empty list with a cell missing from the current run is not a whole comparison: stderr says so."""
    run = ort_cpu_runs["continuous_mlp"]
    fewer = load_results(run)
    gone = fewer["cells"].pop()
    (tmp_path / "results.json").write_text(json.dumps(fewer))
    done = policy_matrix(["compare", "--json", "--baseline", run, "--current", tmp_path / "results.json"])
    assert done.returncode == 0 and json.loads(done.stdout) == []
    assert (f"not compared: 1 cell of the baseline not in the current run: {gone['host']} {gone['target']} {gone['variant']}"
            in done.stderr)


def test_quiet_prints_nothing_and_verbose_names_each_cell(tmp_path):
    args = ("run", MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "5", "--warmup", "1")
    quiet = run_cli("-q", *args, "--out", tmp_path / "q")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    verbose = run_cli("-v", *args, "--out", tmp_path / "v")
    assert verbose.returncode == 0 and "PASS ort-cpu fp32" in verbose.stderr


def test_verbose_reasons_name_the_cell_by_every_axis(tmp_path):
    """With a candidate and a settings grid, '-v' printed 'PASS ort-cpu fp32: ...' for each of four cells: which
    model and which settings each reason was about was left out."""
    student = tmp_path / "student.onnx"
    student.write_bytes(MLP.read_bytes())
    verbose = run_cli("-v", "run", MLP, "--candidate", student, "--targets", "ort-cpu", "--precisions", "fp32",
                      "--settings", "ort-cpu:threads=1,2", "--iters", "5", "--warmup", "1", "--out", tmp_path / "v")
    assert verbose.returncode == 0, verbose.stderr
    named = {line.split(":")[0] for line in verbose.stderr.splitlines() if line.startswith("PASS ort-cpu")}
    assert named == {"PASS ort-cpu fp32 threads=1", "PASS ort-cpu fp32 threads=2",
                     "PASS ort-cpu fp32 student.onnx threads=1", "PASS ort-cpu fp32 student.onnx threads=2"}, verbose.stderr


def test_targets_by_glob_and_skip(tmp_path, policy_matrix):
    done = policy_matrix(["run", MLP, "--targets", "ort-*", "--skip", "ort-web-*,ort-node,ort-cuda*,ort-coreml",
                          "--precisions", "fp32", "--iters", "5", "--warmup", "1", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    assert load_results(tmp_path)["settings"]["targets"] == ["ort-cpu"]


@pytest.mark.parametrize("args", [("--targets", "nope-*"), ("--skip", "nope"), ("--targets", "ort-cpu", "--skip", "ort-*")])
def test_bad_target_selection_is_one_line(args, tmp_path, policy_matrix):
    done = policy_matrix([MLP, *args, "--out", tmp_path])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-5:]


SETTINGS = """targets = ["ort-cpu"]
precisions = "fp32"
iters = 7
warmup = 1
batch-sizes = [1, 3]
out = "from-config"
"""


def test_matrix_toml_sets_run_options_and_the_command_line_wins(tmp_path):
    (tmp_path / "matrix.toml").write_text(SETTINGS + '[tolerance]\n"ort-cpu:fp32" = 0.5\n')
    done = run_in(tmp_path, "run", MLP)
    assert done.returncode == 0, done.stderr
    settings = load_results(tmp_path / "from-config")["settings"]
    assert (settings["targets"], settings["variants"], settings["iters"], settings["batch_sizes"]) == (
        ["ort-cpu"], ["fp32"], 7, [1, 3])
    assert settings["tolerances"] == {"ort-cpu:fp32": 0.5}
    override = run_in(tmp_path, "run", MLP, "--iters", "4", "--out", tmp_path / "cli")
    assert override.returncode == 0, override.stderr
    assert load_results(tmp_path / "cli")["settings"]["iters"] == 4


def test_pyproject_tool_table_is_read(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.policy-matrix]\n" + SETTINGS)
    done = run_in(tmp_path, "run", MLP)
    assert done.returncode == 0, done.stderr
    assert load_results(tmp_path / "from-config")["settings"]["iters"] == 7


@pytest.mark.parametrize("content", ["itres = 7\n", "iters = 'many'\n", "[tolerance]\nfp16 = 'x'\n", "iters = \n"])
def test_bad_config_is_one_line(content, tmp_path, policy_matrix):
    (tmp_path / "matrix.toml").write_text(content)  # found in the folder the CLI runs from (policy_matrix's tmp_path)
    done = policy_matrix([MLP, "--out", tmp_path / "out"])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-5:]


def test_help_documents_the_cache_variable():
    assert "POLICY_MATRIX_CACHE" in run_cli("--help").stdout
