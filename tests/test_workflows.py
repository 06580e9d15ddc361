"""The CI workflows hold up on real runners (actionlint checks syntax in test_merge_compare.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"


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
