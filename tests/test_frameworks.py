"""`policy-matrix frameworks`: the framework registry, the table's rows and escaping, the CleanRL-style
framework end to end (its torch is the Core ML environment's), and the whole table (the `frameworks` tier).

The tier runs only with `-m frameworks` (tests/conftest.py deselects it otherwise): it builds and runs every
framework's policies, tens of minutes once `policy-matrix setup frameworks` has built their environments.
"""

from __future__ import annotations

import json
import re

import pytest

from matrix.errors import InputError
from matrix.frameworks import DEFAULT, MODULES, load, parse
from matrix.frameworks.rows import Row, TargetVerdict
from matrix.frameworks.table import markdown
from tests.conftest import run_cli

QUICK = ("--targets", "ort-cpu,tract", "--episodes", "2", "--iters", "5")


def test_a_release_per_item_compares_two_releases_of_one_framework():
    old, new = parse("sb3@2.4.1,sb3")
    assert (old.name, old.version, new.version) == ("sb3", "2.4.1", load("sb3").version)
    assert old.pins()[0] == "stable-baselines3==2.4.1" and new.pins()[0] == f"stable-baselines3=={new.version}"


@pytest.mark.parametrize("text", ["sb3,sb3", "nope", "sb3@../x", "cleanrl@1.0", ""])
def test_bad_framework_lists_are_one_clear_error(text):
    with pytest.raises(InputError, match="--frameworks"):
        parse(text)


@pytest.mark.parametrize("name", DEFAULT)
def test_each_framework_module_declares_pinned_requirements_and_its_policies(name):
    framework = load(name)
    assert MODULES[name].endswith("_export") and framework.file.is_file()
    assert all(re.fullmatch(r"[A-Za-z0-9_.\[\]-]+==[0-9][0-9A-Za-z.]*", pin) for pin in framework.pins()), framework.pins()
    assert framework.base in ("torch", "tensorflow", None)
    assert framework.unavailable or len(framework.policies) >= 2
    assert set(framework.policies.values()) <= {"CartPole-v1", "Pendulum-v1"}


def test_setup_all_leaves_the_framework_environments_out():
    from matrix.cli.installer import GROUPS, OPT_IN

    assert "frameworks" in GROUPS and "frameworks" in OPT_IN


def test_a_row_summarises_its_targets_and_the_fixes_that_made_them_pass():
    row = Row(framework="sb3 2.9.2", title="", policy="ppo-cartpole", targets=[
        TargetVerdict("ort-cpu", "PASS"), TargetVerdict("coreml", "CONVERTED"),
        TargetVerdict("ort-web-webgl", "FAIL", "no ArgMax kernel", "argmax-cut (then: argmax on the host)")])
    assert row.summary() == "1/3 PASS; coreml CONVERTED; ort-web-webgl FAIL: no ArgMax kernel"
    assert row.fixes() == ["ort-web-webgl: argmax-cut (then: argmax on the host)"]


def test_untrusted_words_in_the_markdown_table_are_escaped():
    hostile = "ERROR: <script>alert(1)</script> | broken [link](x)"
    table = markdown([Row(framework="rllib 2.60.0", title="", problem=hostile)],
                     {"targets": "ort-cpu", "variants": "fp32", "episodes": 1, "seed": 0})
    row = table.splitlines()[-1]
    assert "<script>" not in table and "\\|" in row and row.count(" | ") == 8  # the pipe stays inside its cell


@pytest.mark.slow
@pytest.mark.coreml_env
def test_the_cleanrl_style_module_runs_end_to_end_with_export_parity_measured(tmp_path):
    from targets import coreml_conversion
    from targets.isolated_env import env_python

    if env_python(coreml_conversion.ENV_NAME, coreml_conversion.REQUIREMENTS) is None:
        pytest.skip("needs the Core ML environment's torch: policy-matrix setup coreml")
    done = run_cli("frameworks", "--frameworks", "cleanrl", *QUICK, "--out", tmp_path, timeout=1800)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "frameworks.json").read_text())["rows"]
    assert [row["policy"] for row in rows] == list(load("cleanrl").policies)
    for row in rows:
        assert not row["problem"], row["problem"]
        assert [t["target"] for t in row["targets"]] == ["ort-cpu", "tract"]
        assert row["summary"].startswith("2/2 PASS"), row["summary"]
        assert row["parity_verdict"] == "PASS", row["parity"]  # torch's own forward against the export's float64 reference
        assert row["opset"] and row["export_path"].startswith("torch.onnx.export")
        assert "ONNX reference" in row["returns"] and "framework" in row["returns"]
    assert (tmp_path / "cleanrl-base" / "dqn-cartpole" / "report" / "index.html").exists()
    assert "dqn-cartpole" in (tmp_path / "frameworks.md").read_text()


@pytest.mark.frameworks
@pytest.mark.slow
def test_the_framework_table_measures_five_frameworks_with_two_policies_each(tmp_path):
    done = run_cli("frameworks", "--targets", "ort-cpu,ort-web-wasm,tflite", "--episodes", "1", "--iters", "5",
                   "--out", tmp_path, timeout=6 * 3600)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "frameworks.json").read_text())["rows"]
    measured = {}
    for row in rows:
        if row["targets"]:
            measured.setdefault(row["framework"], []).append(row["policy"])
    assert len([name for name, policies in measured.items() if len(policies) >= 2]) >= 5, measured
    assert {row["framework"] for row in rows} == {load(name).label for name in DEFAULT}  # no silent gap
