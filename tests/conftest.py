"""Shared fixtures: the CLI as a user runs it (a subprocess, real exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from matrix import examples

EXAMPLES = list(examples.BUILDERS)


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "matrix", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def example_path():
    return examples.path


@pytest.fixture(scope="session")
def ort_cpu_runs(tmp_path_factory) -> dict[str, Path]:
    """One real ort-cpu run of every bundled policy, all precisions (shared: it is the slow part)."""
    runs = {}
    for name in EXAMPLES:
        out = tmp_path_factory.mktemp(name)
        done = run_cli("run", examples.path(name), "--targets", "ort-cpu", "--iters", "30", "--warmup", "5", "--out", out)
        assert done.returncode == 0, done.stderr
        runs[name] = out
    return runs


def load_results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.fixture
def load_policy(tmp_path):
    """ModelInfo of a built ONNX graph, loaded the way a run loads a user's file."""
    import onnx

    from matrix import model

    def load(proto: onnx.ModelProto, name: str = "policy"):
        path = tmp_path / f"{name}.onnx"
        onnx.save(proto, str(path))
        return model.load(path)

    return load
