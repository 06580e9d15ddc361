"""The CI workflows hold up on real runners (actionlint checks syntax in test_merge_compare.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrix import results as schema

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
SHARD = REPO / "tests" / "fixtures" / "shard_continuous_mlp.json"  # a real ort-cpu run's results.json


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def steps_using(job: dict, action: str) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").startswith(action)]


@pytest.mark.parametrize("name", ["nightly.yml", "tests.yml"])
def test_each_workflow_has_a_concurrency_group_and_download_caches(name):
    workflow = load(name)
    assert workflow["concurrency"]["group"]
    for job in workflow["jobs"].values():
        for step in steps_using(job, "actions/setup-python"):
            assert step["with"]["cache"] == "pip"
        for step in steps_using(job, "actions/setup-node"):
            assert step["with"]["cache"] == "npm" and "package-lock.json" in step["with"]["cache-dependency-path"]


@pytest.mark.parametrize("name", ["nightly.yml", "tests.yml"])
def test_the_converter_cache_key_names_the_python(name):
    for job in load(name)["jobs"].values():
        for step in steps_using(job, "actions/cache"):
            key = step["with"]["key"]
            assert "steps.python.outputs.python-version" in key and "steps.python.outputs.python-path" in key


def test_the_merge_job_runs_unless_cancelled_and_installs_only_the_core():
    text = (WORKFLOWS / "nightly.yml").read_text()
    assert "always()" not in text
    merge = load("nightly.yml")["jobs"]["merge"]
    assert merge["if"] == "${{ !cancelled() }}"
    commands = [step["run"].strip() for step in merge["steps"] if "run" in step]
    assert "python -m pip install ." in commands  # the core, no extras: merging runs no target
    assert not [command for command in commands if "make " in command or "pip install .[" in command]


def _step(job: dict, name: str) -> dict:
    return next(step for step in job["steps"] if step.get("name") == name)


def test_a_runner_out_of_time_still_uploads_its_shard():
    """A job past its timeout-minutes is cancelled and skips the `!cancelled()` upload: the shard of a runner that ran
    out of time was lost. The matrix step has its own, shorter limit (a step out of time fails, and the upload runs),
    and `exec` hands the runner's signal to make, which passes SIGTERM on to the run that writes its finished cells."""
    shard = load("nightly.yml")["jobs"]["shard"]
    run = _step(shard, "Run the matrix")
    assert run["timeout-minutes"] <= shard["timeout-minutes"] - 15  # setup is inside the step; leave the upload time
    assert run["run"].startswith("exec make matrix ")
    assert _step(shard, "Upload the shard")["if"] == "${{ !cancelled() }}"


def _merge_step(tmp_path: Path, shard: Path, baseline: Path | None) -> subprocess.CompletedProcess:
    """The merge job's 'Merge and compare' step as the runner runs it (bash -e), with `policy-matrix` this checkout's."""
    script = _step(load("nightly.yml")["jobs"]["merge"], "Merge and compare")["run"]
    (tmp_path / "shards" / "shard-linux-x86_64").mkdir(parents=True)
    shutil.copy(shard, tmp_path / "shards" / "shard-linux-x86_64" / "results.json")
    if baseline is not None:
        (tmp_path / "baseline").mkdir()
        shutil.copy(baseline, tmp_path / "baseline" / "results.json")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "policy-matrix").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m matrix "$@"\n')
    (bin_dir / "policy-matrix").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_the_nightly_merge_after_a_model_change_succeeds_and_says_nothing_was_compared(tmp_path):
    """The baseline was the last successful nightly then. With a new policy committed, the step exited 2 ('compare runs of
    the same model') every night: no nightly succeeded again, so the baseline never moved on and no regression of
    the new policy was ever flagged."""
    old_model = schema.load(SHARD)
    old_model.model = {**old_model.model, "name": "policy_v1.onnx", "sha256": "f" * 64}
    old_model.save(tmp_path / "v1.json")
    done = _merge_step(tmp_path, SHARD, tmp_path / "v1.json")
    assert done.returncode == 0, done.stderr
    assert "### ⚠️ not compared with the baseline" in (tmp_path / "reports" / "merged" / "summary.md").read_text()


def test_the_nightly_merge_step_runs_without_a_baseline(tmp_path):
    done = _merge_step(tmp_path, SHARD, None)
    assert done.returncode == 0, done.stderr
    assert schema.load(tmp_path / "reports" / "merged" / "results.json").baseline is None
