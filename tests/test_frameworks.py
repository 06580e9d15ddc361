"""`policy-matrix frameworks`: the framework registry, the table's rows and escaping, the CleanRL-style
framework end to end (its torch is the Core ML environment's), and the whole table (the `frameworks` tier).

The tier runs only with `-m frameworks` (tests/conftest.py deselects it otherwise): it builds and runs every
framework's policies, tens of minutes once `policy-matrix setup frameworks` has built their environments.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from matrix.errors import InputError
from matrix.frameworks import DEFAULT, MODULES, Framework, dryrun, load, parse
from matrix.frameworks.rows import Row, TargetVerdict, framework_row
from matrix.frameworks.table import markdown, write
from tests.conftest import run_cli

QUICK = ("--targets", "ort-cpu,tract", "--episodes", "2", "--iters", "5")
# A framework module of this interpreter's onnx, for the build cache: each build notes its seed in RUNS, so a test
# sees which calls trained and exported and which copied; seed 7 fails as a broken training script does.
PROBE_MODULE = """
import sys

import onnx
from onnx import TensorProto, helper


def build(policy, folder, seed):
    with open({runs!r}, "a") as runs:
        runs.write(f"{{seed}}\\n")
    if seed == 7:
        sys.exit("the training script broke")
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])
    action = helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Identity", ["obs"], ["action"])], policy, [obs], [action])
    onnx.save(helper.make_model(graph), str(folder / "policy.onnx"))
    return {{"task": "Pendulum-v1", "export_path": "onnx.helper"}}


if __name__ == "__main__":
    import _kit

    _kit.main(build)
"""


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


def test_acting_characters_in_the_html_table_are_shown_as_escapes(tmp_path):
    """frameworks.md showed a bidi override or an escape sequence in a runtime's words as its escape; the
    table's index.html passed them to the browser, which displayed the words backwards."""
    words = "tract: node \u202eevil\x1b[31m cannot be translated"
    write([Row(framework="sb3 2.9.2", title="", policy="ppo-cartpole", targets=[TargetVerdict("tract", "FAIL", words)])],
          tmp_path, {"targets": "tract", "variants": "fp32", "episodes": 1, "seed": 0, "frameworks": "sb3"})
    page = (tmp_path / "index.html").read_text()
    assert "node \\u202eevil\\x1b[31m cannot" in page
    for text in (page, (tmp_path / "frameworks.md").read_text()):
        assert "\u202e" not in text and "\x1b" not in text


def _probe(tmp_path: Path, monkeypatch) -> tuple[Framework, Path, Path]:
    """The probe framework (PROBE_MODULE) with a cache of its own: the framework, its module and its RUNS file."""
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs.txt"
    (tmp_path / "recipe").mkdir()
    module = tmp_path / "recipe" / "probe_export.py"
    module.write_text(PROBE_MODULE.format(runs=str(runs)))
    probe = Framework(name="probe", module="probe_export", package="onnx", version="", requirements=(), base=None,
                      policies={"identity": "Pendulum-v1", "other": "Pendulum-v1"}, export="onnx.helper",
                      folder=tmp_path / "recipe")
    return probe, module, runs


@pytest.mark.slow  # six builds, each a process importing onnx
def test_a_policy_is_built_once_per_recipe_and_a_cached_build_says_so(tmp_path, monkeypatch):
    probe, module, runs = _probe(tmp_path, monkeypatch)

    def build(out: str, seed: int = 0, rebuild: bool = False) -> dict:
        folder = tmp_path / out / "identity"
        assert dryrun.build(Path(sys.executable), probe, "identity", folder, seed, rebuild) == ""
        return json.loads((folder / "manifest.json").read_text())

    assert "cached_build" not in build("first")
    copied = build("second")  # another --out, the same recipe: copied from the cache, and it says so
    assert copied["cached_build"].startswith("cached build of ")
    assert (tmp_path / "second" / "identity" / "policy.onnx").read_bytes() == (tmp_path / "first" / "identity" / "policy.onnx").read_bytes()
    row = framework_row(probe, "", "identity", copied)
    assert row.build == copied["cached_build"] and "identity (Pendulum-v1; cached build)" in markdown([row], {
        "targets": "ort-cpu", "variants": "fp32", "episodes": 1, "seed": 0})
    build("seed", seed=1)  # another seed, then another recipe: built again
    module.write_text(module.read_text() + "\n# the recipe changed\n")
    build("edited")
    assert "cached_build" not in build("second", rebuild=True)
    assert runs.read_text().split() == ["0", "1", "0", "0"]
    for _ in range(2):  # a failed build is not cached: the next run tries again
        assert dryrun.build(Path(sys.executable), probe, "identity", tmp_path / "broken" / "identity", 7) == "the training script broke"
    assert runs.read_text().split() == ["0", "1", "0", "0", "7", "7"]


@pytest.mark.slow  # three builds, each a process importing onnx
def test_the_cache_keeps_one_build_per_policy_the_latest(tmp_path, monkeypatch):
    probe, module, _ = _probe(tmp_path, monkeypatch)
    builds = tmp_path / "cache" / "framework-builds"

    def build(policy: str, seed: int = 0) -> None:
        assert dryrun.build(Path(sys.executable), probe, policy, tmp_path / f"{policy}-{seed}" / policy, seed) == ""

    build("other")
    build("identity")
    module.write_text(module.read_text() + "\n# the recipe changed\n")
    build("identity", seed=1)  # another recipe of the same policy: the older build goes, the other policy's stays
    entries = sorted(path.name for path in builds.iterdir() if not path.name.endswith(".lock"))
    assert [entry.rsplit("-", 1)[0] for entry in entries] == ["probe-base-identity", "probe-base-other"]
    assert entries[0].endswith(dryrun.build_key(Path(sys.executable), probe, "identity", 1))  # the one just built


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
