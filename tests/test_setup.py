"""Setting up, as a new user would: `make setup` twice, and pip's path from a built wheel to a web cell."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from matrix.cli import installer
from targets import coreml, isolated_env
from targets.build_once import build_once
from targets.paths import cache_dir

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.coreml_env]

REPO = Path(__file__).resolve().parent.parent
# A `make` started inside `make test` would otherwise announce its directories.
PLAIN_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
# The pip the wheel's venv gets: the dev venv's own release, so both pips resolve alike.
VENV_PIP = f"pip=={importlib.metadata.version('pip')}"


def test_make_setup_twice_the_second_is_quiet():
    first = subprocess.run(["make", "setup"], cwd=REPO, capture_output=True, text=True, env=PLAIN_ENV, timeout=3600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Traceback" not in first.stdout + first.stderr
    second = subprocess.run(["make", "setup"], cwd=REPO, capture_output=True, text=True, env=PLAIN_ENV, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (second.stdout + second.stderr).strip() == ""


def test_extra_requirements_come_from_the_package_metadata():
    assert any(line.startswith("tract") for line in installer.extra_requirements("tract"))
    assert installer.unmet(["click>=1", "click<1", "no-such-package-policy-matrix==1"]) == [
        "click<1", "no-such-package-policy-matrix==1"]


def test_a_converter_environment_is_keyed_by_the_python_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path))
    pins = tmp_path / "pins.txt"
    pins.write_text("# nothing to install\n")
    first = isolated_env.env_dir("probe", pins)
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert isolated_env.env_dir("probe", pins) != first


def test_an_environment_whose_python_is_gone_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path))
    pins = tmp_path / "pins.txt"
    pins.write_text("# nothing to install\n")
    python = isolated_env.ensure_env("probe", pins)
    assert isolated_env.env_python("probe", pins) == python
    config = python.parent.parent / "pyvenv.cfg"  # as a cache restored onto a runner whose Python moved
    config.write_text("\n".join(f"home = {tmp_path / 'gone'}" if line.startswith("home") else line
                                for line in config.read_text().splitlines()))
    assert isolated_env.env_python("probe", pins) is None
    rebuilt = isolated_env.ensure_env("probe", pins)
    assert subprocess.run([rebuilt, "-c", "import sys"], timeout=120).returncode == 0
    assert f"home = {tmp_path / 'gone'}" not in config.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PyPI's torch is a CUDA build on Linux only")
def test_coreml_environment_has_cpu_torch_on_linux():
    python = isolated_env.env_python(coreml.ENV_NAME, coreml.REQUIREMENTS)
    assert python is not None, "make setup builds it"
    # torch/version.py, where torch.__version__ and torch.version.cuda come from, read in that environment without
    # importing torch (~5 CPU s); the tests that convert with it or run --source torch import it.
    read = ("import importlib.util, runpy; folder = importlib.util.find_spec('torch').submodule_search_locations[0]; "
            "version = runpy.run_path(f'{folder}/version.py'); print(version['__version__'], version['cuda'])")
    done = subprocess.run([python, "-c", read], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == [f"{coreml.pinned_versions()['torch']}+cpu", "None"], done.stderr


def _build_backend_wheels() -> Path:
    """The wheels of pyproject.toml's build requirements (setuptools), downloaded once per requirement list and Python
    into the cache: pip's isolated build environment installs them from there instead of asking the index again."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    key = hashlib.sha256("\n".join([*requires, sys.version]).encode()).hexdigest()[:16]
    folder = cache_dir() / "test-wheels" / f"build-{key}"

    def download(staging: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", staging, *requires],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    build_once(folder, download)
    return folder


def _wheel(tmp_path: Path) -> Path:
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(_build_backend_wheels())}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp_path / "wheels", REPO],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **offline})
    assert done.returncode == 0, done.stderr
    return next((tmp_path / "wheels").glob("policy_matrix-*.whl"))


def _dependency_wheels(wheel: Path) -> Path:
    """The wheels pip resolves from the index for the wheel and for `setup web` (Python Playwright), downloaded once
    per dependency list, Python and platform into the cache: installing from there resolves the same set offline.
    From the index, every session asked it for each dependency and downloaded ~16 wheels (onnxruntime, onnx,
    playwright, ...: pip's own cache is not kept on CI machines like this one), ~13 CPU-s of this test."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))).decode()
    web = REPO / "web_harness" / "requirements.txt"
    needs = [line for line in metadata.splitlines() if line.startswith(("Requires-Dist:", "Requires-Python:"))]
    key = hashlib.sha256("\n".join([*needs, web.read_text(), VENV_PIP, sys.version, platform.platform()]).encode()).hexdigest()[:16]
    folder = cache_dir() / "test-wheels" / key

    def download(staging: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", staging, wheel, "-r", web,
                               VENV_PIP],
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        for own in staging.glob("policy_matrix-*.whl"):  # the wheel under test is always this session's
            own.unlink()

    build_once(folder, download)
    return folder


@pytest.mark.slow
def test_the_wheel_sets_up_and_runs_a_web_cell_outside_the_source_tree(tmp_path):
    wheel = _wheel(tmp_path)
    wheels = _dependency_wheels(wheel)
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("web_harness/package.json", "web_harness/package-lock.json", "web_harness/requirements.txt",
                    "web_harness/page/harness.mjs", "web_harness/node/runner.mjs", "matrix/results.schema.json"):
        assert shipped in names
    assert not [name for name in names if "node_modules" in name]

    # A venv without ensurepip: ensurepip installs and byte-compiles its bundled pip, ~9 CPU-s (25 s of wall on a
    # loaded machine). The dev venv's pip installs into it instead (--python): the wheel with its dependencies, and
    # pip itself, which `setup web` runs to install Playwright. No PYTHONPATH: pip inspects the venv's interpreter,
    # and a checkout's policy_matrix.egg-info on its path would pass for the wheel already installed.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"], check=True, timeout=300)
    bin_dir = tmp_path / "venv" / "bin"
    # --no-compile: byte-compiling every module of every dependency (sympy, pandas, matplotlib, ...) cost this test
    # ~30 s; the commands below compile only what they import, once (PYTHONDONTWRITEBYTECODE is left out for them).
    # pip resolves the wheel's dependencies (and `setup web` its Playwright) from those wheels alone: --no-index.
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    install = subprocess.run([sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--quiet",
                              "--no-compile", "--disable-pip-version-check", wheel, VENV_PIP],
                             capture_output=True, text=True, timeout=1800, env={**os.environ, **offline, "PYTHONPATH": ""})
    assert install.returncode == 0, install.stderr[-3000:]
    home = tmp_path / "elsewhere"  # not the checkout: nothing may come from the source tree
    home.mkdir()
    # npm_config_prefer_offline: `setup web`'s npm ci takes what npm's cache holds without asking the registry
    # whether it changed (make setup filled it; anything missing is still fetched), ~4 of its ~13 CPU-s.
    env = {**PLAIN_ENV, **offline, "npm_config_prefer_offline": "true", "POLICY_MATRIX_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": ""}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def cli(*args, timeout=1800):
        return subprocess.run([bin_dir / "policy-matrix", *map(str, args)], cwd=home, capture_output=True, text=True,
                              env=env, timeout=timeout)

    setup = cli("setup", "web")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert list((tmp_path / "cache" / "web-harness").glob("*/node_modules/onnxruntime-web/package.json"))
    again = cli("setup", "web")
    assert again.returncode == 0 and (again.stdout + again.stderr).strip() == "", again.stdout + again.stderr

    rows = {row["name"]: row for row in json.loads(cli("targets", "--json").stdout)}
    assert rows["ort-web-wasm"]["available"], rows["ort-web-wasm"]["reason"]
    model = subprocess.run([bin_dir / "python", "-c", "from matrix.inputs import examples; print(examples.path('continuous_mlp'))"],
                           cwd=home, capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert not Path(model).is_relative_to(REPO)
    done = cli("run", model, "--targets", "ort-web-wasm", "--precisions", "fp32", "--iters", "10", "--warmup", "2",
               "--out", home / "report")
    assert done.returncode == 0, done.stderr
    cell = json.loads((home / "report" / "results.json").read_text())["cells"][0]
    assert cell["verdict"] == "PASS", cell["reasons"]
    assert "onnxruntime-web 1.30.0" in cell["runtime_version"]
