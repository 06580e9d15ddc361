"""Installing a pinned release (targets/versions.py, matrix/run/orchestrate.install_releases): a line per step when
not on a terminal, and a failed install leaves nothing beside the installed releases. pip runs for real, told
to use no package index (PIP_NO_INDEX), so it fails at once and offline as it would for a missing release."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import targets
from matrix.run.orchestrate import install_releases
from targets import versions


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return tmp_path / "cache"


def test_a_failed_install_leaves_nothing_beside_the_releases(empty_cache):
    release = versions.release_of(targets.get("ort-cpu"))
    with pytest.raises(versions.VersionUnavailable, match="pip cannot install onnxruntime==1.19.2"):
        release.install("1.19.2")
    assert not release.installed("1.19.2")
    releases = release.directory("1.19.2").parent
    assert [path.name for path in releases.iterdir()] == [".locks"]  # no lock, no half-made folder among them


def test_each_install_step_is_a_line_when_not_on_a_terminal(empty_cache):
    out = io.StringIO()
    install_releases(["ort-cpu@1.19.2", "ort-cpu@1.18.1"], Console(file=out, width=60))
    lines = out.getvalue().splitlines()
    assert lines[0] == "release: ort-cpu@1.19.2: installing onnxruntime 1.19.2 from the package registry…"
    assert lines[1].startswith("release: ort-cpu@1.19.2: pip cannot install onnxruntime==1.19.2 here: ")
    assert lines[2].startswith("release: ort-cpu@1.18.1: not run: ort-cpu@1.18.1 is older than the harness supports")
    assert len(lines) == 3  # below the floor: nothing to install, so no 'installing' line
