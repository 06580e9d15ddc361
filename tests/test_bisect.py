"""`policy-matrix bisect` on a real runtime: onnxruntime's releases, installed for real (pip, into the shared
cache, once; later runs reuse them).

The measure that changes was measured first: jax2onnx's default export (opset 23, IR 10) fails to load in
onnxruntime 1.21.0, 1.21.1, 1.22.0 and 1.22.1 ("Opset 23 is under development") and runs from 1.23.0 on. So the
verdict changes at a known release whatever the machine's speed.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from conftest import run_cli
from policies import jax2onnx_default_mlp, save

pytestmark = pytest.mark.slow

RANGE = ["1.21.0", "1.21.1", "1.22.0", "1.22.1", "1.23.0"]  # what the registry offers from 1.21.0 to 1.23.0


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return save(jax2onnx_default_mlp(), tmp_path_factory.mktemp("policy"), "jax2onnx_mlp")


def _bisect(policy, out, release_range: str):
    return run_cli("bisect", "ort-cpu", release_range, policy, "--out", out, "--iters", "10", "--warmup", "1",
                   "--n-obs", "16", timeout=900)


def _visited(out) -> list[str]:
    return sorted(path.name for path in (out / "releases").iterdir())


@pytest.fixture(scope="module")
def bisected(policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("bisect")
    return _bisect(policy, out, f"{RANGE[0]}..{RANGE[-1]}"), out


def test_bisect_names_the_release_that_first_runs_the_policy(bisected):
    done, tmp_path = bisected
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("first changed in onnxruntime 1.23.0 (1.22.1: FAIL, open: ")
    assert line.endswith("; 1.23.0: PASS)")
    visited = _visited(tmp_path)
    assert len(visited) <= math.ceil(math.log2(len(RANGE))) + 1 and {"1.21.0", "1.22.1", "1.23.0"} <= set(visited)
    for release in visited:  # each visit really ran that release
        cell = json.loads((tmp_path / "releases" / release / "results.json").read_text())["cells"][0]
        assert cell["runtime_version"] == f"onnxruntime {release}"
    table = (tmp_path / "bisect.md").read_text()
    assert "| 1.23.0 | PASS |" in table and "| 1.22.1 | FAIL |" in table and "| 1.21.1 | not visited |" in table
    neighbours = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert [cell["target"] for cell in neighbours] == ["ort-cpu@1.22.1", "ort-cpu@1.23.0"]
    assert "/4 " in done.stderr and "1.22.1: FAIL" in done.stderr  # each step printed as it went


def test_no_change_in_the_range_exits_1_and_a_second_bisect_keeps_the_runs(policy, tmp_path):
    done = _bisect(policy, tmp_path, f"{RANGE[0]}..{RANGE[3]}")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("no change in verdict from onnxruntime 1.21.0 to 1.22.1")
    assert RANGE[3] in _visited(tmp_path) and len(_visited(tmp_path)) <= 3
    assert f"ort-cpu@{RANGE[0]}" in (tmp_path / "index.html").read_text()  # the page of the ends, as the README says
    again = _bisect(policy, tmp_path, f"{RANGE[0]}..{RANGE[3]}")
    assert again.returncode == 1 and again.stdout == done.stdout
    assert again.stderr.count("kept from an earlier bisect") == len(_visited(tmp_path))
    other = run_cli("bisect", "ort-cpu", f"{RANGE[0]}..{RANGE[3]}", policy, "--out", tmp_path, "--iters", "11", "--warmup", "1",
                    "--n-obs", "16", timeout=900)
    assert other.returncode == 1 and "kept from an earlier bisect" not in other.stderr  # other settings: measured again


@pytest.mark.parametrize("args, words", [
    (["ort-cpu", "1.23.0..1.21.0"], "OLD must be older"),
    (["ort-cpu", "1.10.0..1.23.0"], "not among the releases offered"),
    (["ort-cpu@1.20.1", "1.21.0..1.23.0"], "without @RELEASE"),
    (["ort-cpu", "1.21"], "expected OLD..NEW"),
    (["ort-cpu", "1.21.0..1.23.0", "--variant", "fp32,int8"], "one variant"),
    (["ort-cpu", "1.21.0..1.23.0", "--measure", "return"], "needs --env"),
    (["ort-cpu", "1.21.0..1.23.0", "--side-input", "obs=1"], "--side-input 'obs': this input carries the batch"),
])
def test_bad_input_is_one_line_and_exit_2(policy, tmp_path, args, words, policy_matrix):
    done = policy_matrix(["bisect", *args[:2], policy, *args[2:], "--out", tmp_path])
    assert done.returncode == 2 and len(done.lines) == 1 and words in done.lines[0], done.lines[-5:]


def test_the_release_list_marks_the_default_and_the_releases_the_bisect_installed(bisected):
    import onnxruntime

    done = run_cli("targets", "--versions", "ort-cpu", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["release"]: row for row in json.loads(done.stdout)}
    assert rows[onnxruntime.__version__]["default"] and rows[onnxruntime.__version__]["installed"]
    assert [r for r in rows if rows[r]["default"]] == [onnxruntime.__version__]
    for release in _visited(bisected[1]):
        assert rows[release]["installed"] and not rows[release]["default"]
    text = run_cli("targets", "--versions", "ort-cpu").stdout
    assert f"{onnxruntime.__version__} (default)" in text and "1.23.0 (installed)" in text


def test_pips_release_list_is_asked_once_per_pip_configuration_and_no_answer_keeps_its_words(tmp_path, monkeypatch):
    import targets as registry
    from targets import versions

    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path))
    release = versions.release_of(registry.get("ort-cpu"))
    assert set(RANGE) <= set(release.registry_versions())  # pip's answer, kept
    [kept] = (tmp_path / "runtimes" / "pip-index").iterdir()
    kept.write_text(json.dumps(["9.9.9"]))
    assert release.registry_versions() == ["9.9.9"]  # read back, pip not asked again
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)  # another configuration, an index that cannot answer
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri())
    with pytest.raises(RuntimeError, match="^pip index versions onnxruntime: ERROR: No matching distribution"):
        release.registry_versions()
