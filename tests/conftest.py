"""Shared fixtures: the CLI as a user runs it (a subprocess, real exit codes) or in the test process (policy_matrix)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from matrix.inputs import examples

EXAMPLES = list(examples.BUILDERS)

# The runtime each marker's tests need, by the targets that stand for it (`policy-matrix targets` says why one is
# missing). Locally a missing one makes its tests SKIP with that reason; on CI (CI=true, as every CI service sets)
# it is an error, so a broken setup step cannot turn the browser, tflite or Core ML suite into a green row of skips.
# Tests that cannot run on the host at all (macOS-only prediction, a GPU) keep their own skipif and still skip.
RUNTIME_MARKERS = {"browser": ("ort-web-wasm", "ort-node"), "tflite_env": ("tflite",), "coreml_env": ("coreml",)}


def missing_runtimes(markers) -> list[str]:
    """'marker: target: reason' for every runtime the markers need that this host lacks."""
    from targets import REGISTRY

    return [f"{marker}: {name}: {reason}" for marker in markers if marker in RUNTIME_MARKERS
            for name in RUNTIME_MARKERS[marker] if (reason := REGISTRY[name].unavailable_reason())]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist turns the xdist_group marks into scheduling groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`), a module whose tests share a module- or
    class-scoped fixture (a CLI run they only read, a converted model, started browsers) runs on one worker, so the
    fixture is made once; tests that share nothing wider than themselves are spread one by one."""
    _deselect_frameworks_tier(config, items)
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _shares_a_fixture(item) -> bool:
    fixtures = getattr(item, "_fixtureinfo", None)  # None for items that are not test functions
    return bool(fixtures) and any(definitions[-1].scope in ("module", "class", "package")
                                  for definitions in fixtures.name2fixturedefs.values())


def _deselect_frameworks_tier(config, items) -> None:
    """The frameworks tier (the whole framework table, tens of minutes) runs only when `-m` names it."""
    if "frameworks" in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker("frameworks") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.hookimpl(tryfirst=True)  # before the skipif markers are evaluated
def pytest_runtest_setup(item):
    _fail_if_not_grouped(item)
    if os.environ.get("CI", "").lower() == "true":
        if missing := missing_runtimes(marker.name for marker in item.iter_markers()):
            pytest.fail("CI must run this test, but a runtime it needs is missing: " + "; ".join(missing), pytrace=False)


def _fail_if_not_grouped(item) -> None:
    """pytest-xdist groups by a suffix it writes into each grouped test's nodeid; pytest 9.2 ignores that write
    (pytest-dev/pytest-xdist#1386), and each worker would then make every module's shared runs and browsers again."""
    if getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail(f"--dist loadgroup did not group this test (pytest {pytest.__version__}, pytest-dev/pytest-xdist#1386): "
                    "`make setup` installs the pytest that pyproject.toml pins", pytrace=False)


@contextlib.contextmanager
def chromium_page():
    """A browser page for reading a report, launched from the process's one Playwright driver: the web target tests
    open their pages in the test process too, and a second `sync_playwright()` there fails; the flags the targets use."""
    from targets import chromium

    browser = chromium.playwright_driver().chromium.launch(executable_path=chromium.chromium_executable(),
                                                           args=chromium.CHROMIUM_FLAGS)
    try:
        yield browser.new_page()
    finally:
        browser.close()


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "matrix", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@dataclass
class CliRun:
    """A CLI run, read as a subprocess.CompletedProcess is (returncode, stdout, stderr), and by stderr's lines."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        """stderr's non-blank lines."""
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture
def policy_matrix(tmp_path, monkeypatch, capsys):
    """Run `policy-matrix ARGS` in this process, as `cli.main()` runs it (the jobs and workers it starts are still
    processes of their own), without a subprocess to start and import per case: for refusals, and for runs whose
    outputs a test only reads (the process boundary, signals and exit are tested through `run_cli`). The fork
    server a run starts stays warm for the worker's next runs, so their jobs are forked, not started. ARGS that do
    not start with a command are a `run`'s."""
    from matrix.cli import cli

    monkeypatch.chdir(tmp_path)  # no matrix.toml of the checkout is found
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}

    def invoke(args: list) -> CliRun:
        command = [] if str(args[0]) in cli.app.commands else ["run"]
        monkeypatch.setattr(sys, "argv", ["policy-matrix", *command, *map(str, args)])
        try:
            with pytest.raises(SystemExit) as ended:
                cli.main()
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
        captured = capsys.readouterr()
        return CliRun(ended.value.code, captured.out, captured.err)

    return invoke


@pytest.fixture(scope="session")
def example_path():
    return examples.path


def _session_folder(config, tmp_path_factory) -> Path:
    """A folder of this test session that every pytest-xdist worker sees (each worker has its own basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(scope="session")
def ort_cpu_runs(request, tmp_path_factory) -> dict[str, Path]:
    """One real ort-cpu run of every bundled policy, all precisions (shared: it is the slow part). Under
    pytest-xdist the first worker that needs it makes it and the others read it."""
    folder = _session_folder(request.config, tmp_path_factory) / "ort_cpu_runs"
    runs = {name: folder / name for name in EXAMPLES}
    with FileLock(f"{folder}.lock"):
        if not (folder / "complete").exists():
            for name, out in runs.items():
                done = run_cli("run", examples.path(name), "--targets", "ort-cpu", "--iters", "30", "--warmup", "5",
                               "--out", out)
                assert done.returncode == 0, done.stderr
            (folder / "complete").touch()
    return runs


def load_results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.fixture
def load_policy(tmp_path):
    """ModelInfo of a built ONNX graph, loaded the way a run loads a user's file."""
    import onnx

    from matrix.inputs import model

    def load(proto: onnx.ModelProto, name: str = "policy"):
        path = tmp_path / f"{name}.onnx"
        onnx.save(proto, str(path))
        return model.load(path)

    return load
