"""On CI a test that needs a missing runtime fails instead of skipping (tests/conftest.py):
checked for real with an empty cache, where the onnx2tf environment does not exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing_runtimes

NEEDS_TFLITE = '''
import pytest, targets

pytestmark = pytest.mark.tflite_env

@pytest.mark.skipif(targets.get("tflite").unavailable_reason() is not None, reason="no onnx2tf environment")
def test_converts():
    pass
'''


def _pytest(folder: Path, ci: str, cache: Path) -> subprocess.CompletedProcess:
    """pytest on a test file outside tests/, with tests/conftest.py loaded as a plugin (`-p conftest`)."""
    (folder / "test_needs_tflite.py").write_text(NEEDS_TFLITE)
    tests = Path(__file__).resolve().parent
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "CI": ci, "POLICY_MATRIX_CACHE": str(cache),
           "PYTHONPATH": f"{tests}:{tests.parent}"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "-c", str(tests.parent / "pyproject.toml"), "--rootdir", str(folder), "test_needs_tflite.py"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=folder)


def test_missing_runtimes_names_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path))
    missing = missing_runtimes(["tflite_env", "slow"])
    assert len(missing) == 1 and missing[0].startswith("tflite_env: tflite: ") and "policy-matrix setup tflite" in missing[0]
    assert missing_runtimes(["slow", "parametrize"]) == []


@pytest.mark.slow  # two pytest subprocesses
def test_a_missing_runtime_skips_locally_and_fails_on_ci(tmp_path):
    cache = tmp_path / "empty-cache"
    local = _pytest(tmp_path, "", cache)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout + local.stderr
    ci = _pytest(tmp_path, "true", cache)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "CI must run this test, but a runtime it needs is missing: tflite_env: tflite:" in ci.stdout
