"""--browser-endpoint and --browser-path: the browser targets in a browser the user chose.

The user's browser is a second, real Chromium that the test starts on loopback with a
random DevTools port, as a person starts their desktop Chrome."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import load_results, run_cli

from matrix.inputs.examples import path as example
from targets import chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(chromium.web_unavailable_reason() is not None, reason=str(chromium.web_unavailable_reason()))]


def _json(url: str):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.load(reply)


def _wait_for(predicate, timeout_s: float, what: str):
    """Poll a state until it holds (the machine may be busy): never a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := predicate()) is not None:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} within {timeout_s} s")


@pytest.fixture(scope="module")
def user_chromium():
    """A headless Chromium with DevTools on 127.0.0.1 at a port the OS picks; yields its ws:// endpoint."""
    with tempfile.TemporaryDirectory(prefix="user-chromium-") as profile:
        process = subprocess.Popen(
            [chromium.chromium_executable(), *chromium.CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = Path(profile) / "DevToolsActivePort"

        def answering():
            assert process.poll() is None, "the user's Chromium exited at start"
            if not (port_file.exists() and port_file.read_text().strip()):
                return None
            try:
                return _json(f"http://127.0.0.1:{port_file.read_text().split()[0]}/json/version")
            except OSError:
                return None

        version = _wait_for(answering, 60, "the user's Chromium answered on its DevTools port")
        yield version["webSocketDebuggerUrl"], process
        # the whole session (renderer, GPU, utility processes): one still writing the profile fails its removal
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        _wait_for(lambda: not _session_alive(process.pid) or None, 30, "the user's Chromium's processes ended")


def _session_alive(session: int) -> bool:
    return any(_session_of(p) == session for p in psutil.pids())


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_browser_endpoint_runs_the_harness_in_the_users_browser(user_chromium, tmp_path):
    endpoint, process = user_chromium
    http = chromium.devtools_http(endpoint)
    seen, done = set(), threading.Event()

    def watch_pages():  # which pages the user's browser shows while the run goes on (sampled every 20 ms)
        while not done.wait(0.02):
            try:
                seen.update(target["url"] for target in _json(f"{http}/json/list"))
            except OSError:
                pass

    watcher = threading.Thread(target=watch_pages, daemon=True)
    watcher.start()
    try:
        run = run_cli("run", example("continuous_mlp"), "--targets", "ort-web-wasm", "--precisions", "fp32",
                      "--iters", "20", "--warmup", "2", "--browser-endpoint", endpoint, "--out", tmp_path)
    finally:
        done.set()
        watcher.join(timeout=10)
    assert run.returncode == 0, run.stderr
    (cell,) = load_results(tmp_path)["cells"]
    assert cell["verdict"] == "PASS" and cell["latency"] and cell["latency"][0]["p50_us"] > 0
    assert "at --browser-endpoint" in cell["runtime_version"]
    assert any(url.endswith("/harness/index.html") for url in seen), seen  # the harness ran in the user's browser
    assert process.poll() is None and _json(f"{http}/json/version")  # the run left the user's browser running


def test_browser_path_launches_the_given_executable(tmp_path):
    calls = tmp_path / "calls.log"
    wrapper = tmp_path / "my-chrome"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {chromium.chromium_executable()} "$@"\n')
    wrapper.chmod(0o755)
    run = run_cli("run", example("continuous_mlp"), "--targets", "ort-web-wasm", "--precisions", "fp32",
                  "--iters", "20", "--warmup", "2", "--browser-path", wrapper, "--out", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    assert load_results(tmp_path / "out")["cells"][0]["verdict"] == "PASS"
    launches = [line for line in calls.read_text().splitlines() if line.strip() != "--version"]
    assert launches, "the given executable was never launched"


@pytest.mark.parametrize("option, value, words", [
    ("--browser-endpoint", "ws://127.0.0.1:1/devtools/browser/none", "no DevTools endpoint answers"),
    ("--browser-endpoint", "chrome", "is neither ws://"),
    ("--browser-path", "/nonexistent/chrome", "not an executable file"),
])
def test_a_bad_browser_option_is_one_line_and_exit_2(option, value, words, tmp_path, policy_matrix):
    done = policy_matrix([example("continuous_mlp"), "--targets", "ort-web-wasm", option, value, "--out", tmp_path])
    assert done.returncode == 2 and len(done.lines) == 1 and words in done.lines[0], done.lines[-5:]
    assert not (tmp_path / "results.json").exists()
