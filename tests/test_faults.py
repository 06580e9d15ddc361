"""Injected faults: a killed worker, a killed runner (then --resume), SIGTERM, a killed
browser's processes, a write error, two runs on one folder, a memory cap, a hanging
reference. Every wait is for a state (a process, a file, a line), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import re
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import onnx
import psutil
import pytest
from conftest import load_results, run_cli
from onnx import TensorProto, helper, numpy_helper

from matrix import outdir
from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.slow, pytest.mark.browser]

MLP = example("continuous_mlp")
SLOW = ["--iters", "50000000"]  # a timing loop far longer than any test waits
STATE_TIMEOUT_S = 300  # generous: CI is a busy 2-core machine; a state that never comes fails the test


def _start(*args: object, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "matrix", "run", *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _wait_for(condition, what: str, timeout: float = STATE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"never saw: {what}")


def _descendants(pid: int, name: str) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if name in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _worker_of(run: subprocess.Popen, cell_dir: Path) -> psutil.Process:
    """The worker process while it runs one cell: a worker serves a target's cells in turn and
    writes each cell's stderr to that cell's worker.log."""
    log = (cell_dir / "worker.log").resolve()

    def serving() -> psutil.Process | None:
        return next((worker for worker in _descendants(run.pid, "matrix.run.worker") if _stderr_is(worker, log)), None)

    return _wait_for(serving, f"a worker for {cell_dir}")


def _stderr_is(process: psutil.Process, log: Path) -> bool:
    try:
        return any(f.fd == 2 and Path(f.path) == log for f in process.open_files())
    except psutil.Error:
        return False


def _jsonl(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive, f"left running: {alive}"


def test_a_killed_worker_costs_its_cell_only(tmp_path):
    run = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32,fp16", *SLOW, "--timeout", "600", "--out", tmp_path)
    worker = _worker_of(run, tmp_path / "cells" / "ort-cpu-fp32")
    worker.kill()
    _worker_of(run, tmp_path / "cells" / "ort-cpu-fp16").kill()
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    assert run.returncode == 1, stderr
    cells = load_results(tmp_path)["cells"]
    assert [c["verdict"] for c in cells] == ["FAIL", "FAIL"]
    assert cells[0]["error"]["message"].startswith("killed by signal 9 (SIGKILL) after")
    assert "timed out" not in cells[0]["error"]["message"]


def test_runner_kill_9_takes_its_worker_along_and_resume_finishes_the_matrix(tmp_path):
    args = ["--targets", "ort-cpu", "--precisions", "fp32,fp16,int8", "--iters", "20", "--batch-sizes", "1",
            "--host-label", "resume-host"]
    run = _start(MLP, *args, "--out", tmp_path)
    _wait_for(lambda: len(_jsonl(tmp_path)) >= 1, "the first finished cell in results.jsonl")
    workers = _descendants(run.pid, "matrix.run.worker")
    run.kill()
    run.wait()
    _assert_gone(workers)  # the parent-death signal: no worker outlives its runner
    kept = _jsonl(tmp_path)
    assert all(line["run_id"] == kept[0]["run_id"] and line["model_sha256"] for line in kept)

    done = run_cli("run", MLP, *args, "--resume", tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"keeping {len(kept)} finished cells" in done.stderr
    results = load_results(tmp_path)
    assert [c["variant"] for c in results["cells"]] == ["fp32", "fp16", "int8"]
    assert all(c["verdict"] == "PASS" for c in results["cells"])
    for line in kept:  # the kept cells are the measured ones, not re-measured
        cell = next(c for c in results["cells"] if c["variant"] == line["variant"])
        assert cell["duration_s"] == line["duration_s"]
    lines = _jsonl(tmp_path)
    assert len(lines) == 3 and len({line["run_id"] for line in lines}) == 1


def test_resume_refuses_other_settings(tmp_path, policy_matrix):
    first = policy_matrix(["run", MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "5", "--out", tmp_path])
    assert first.returncode == 0, first.stderr
    done = policy_matrix([MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "6", "--resume", tmp_path])
    assert done.returncode == 2 and "options differ" in "\n".join(done.lines) and "iters" in "\n".join(done.lines), done.lines
    done = policy_matrix([example("discrete_mlp"), "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "5",
                          "--resume", tmp_path])
    assert done.returncode == 2 and "another model" in "\n".join(done.lines), done.lines


def test_a_rerun_keeps_the_previous_runs_lines(tmp_path, policy_matrix):
    for _ in range(2):
        done = policy_matrix(["run", MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "5", "--out", tmp_path])
        assert done.returncode == 0, done.stderr
    lines = _jsonl(tmp_path)
    assert len(lines) == 2 and lines[0]["run_id"] != lines[1]["run_id"]
    assert len(load_results(tmp_path)["cells"]) == 1


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# "inherited ignored": a background job of a non-interactive shell (`make test &` in a script) starts with
# SIGINT ignored, and Python then installs no Ctrl-C handler of its own; the runner must install it anyway.
@pytest.mark.parametrize("sent, code, preexec", [(signal.SIGTERM, 143, None), (signal.SIGINT, 130, None),
                                                 (signal.SIGINT, 130, _ignore_sigint)],
                         ids=["SIGTERM", "SIGINT", "SIGINT inherited ignored"])
def test_a_signalled_run_writes_its_report_and_leaves_nothing_running(tmp_path, sent, code, preexec):
    run = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32,fp16", *SLOW, "--out", tmp_path, preexec_fn=preexec)
    worker = _worker_of(run, tmp_path / "cells" / "ort-cpu-fp32")
    run.send_signal(sent)
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    assert run.returncode == code, stderr
    assert "interrupted" in stderr and (tmp_path / "index.html").exists()
    _assert_gone([worker])


def test_a_ctrl_c_while_the_program_starts_is_one_line(tmp_path):
    """The terminal's Ctrl-C reaches the runner's whole group while it still imports its command line (~0.3 s after
    it forked its fork server, before any handler of its own): it printed KeyboardInterrupt's traceback, and the
    server, forked and not yet in a session of its own, a second one from the runner's stack. Sent as soon as the
    server is there, polled closely: later, the runner's own handler answers, as the test above checks."""
    run = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--out", tmp_path, start_new_session=True,
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while not psutil.Process(run.pid).children() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(run.pid, signal.SIGINT)
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    assert run.returncode == 130, stderr
    assert stderr.strip() == "policy-matrix: interrupted", stderr


TGKILL = {"x86_64": 234, "aarch64": 131}  # the tgkill system call's number (Linux; Python has no binding for it)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() not in TGKILL, reason="Linux's tgkill")
def test_a_signal_the_kernel_gives_another_thread_still_stops_the_run(tmp_path):
    """A SIGTERM sent to the process may be delivered to any of its threads (a cell's, a relay's), and Python runs
    the handler in the main thread only when that thread next wakes: waiting for the cells without a timeout, the
    run went on for 192 s, until its worker's cells ended (seen in CI). tgkill puts the signal on one other thread."""
    run = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32", *SLOW, "--out", tmp_path)
    worker = _worker_of(run, tmp_path / "cells" / "ort-cpu-fp32")
    _tgkill(run.pid, _thread_taking(run.pid, signal.SIGTERM), signal.SIGTERM)
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    assert run.returncode == 143, stderr
    assert "interrupted" in stderr and (tmp_path / "index.html").exists()
    _assert_gone([worker])


def _thread_taking(pid: int, number: int) -> int:
    """A thread of `pid` other than its main one that does not block signal `number` (/proc's SigBlk mask)."""
    for thread in psutil.Process(pid).threads():
        status = Path(f"/proc/{pid}/task/{thread.id}/status").read_text()
        blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)", status, re.M).group(1), 16)
        if thread.id != pid and not blocked >> (number - 1) & 1:
            return thread.id
    raise AssertionError(f"process {pid} has no thread besides its main one that takes signal {number}")


def _tgkill(pid: int, thread: int, number: int) -> None:
    """The signal to one thread of a process (os.kill picks the thread itself; signal.pthread_kill reaches this
    process's own threads only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(TGKILL[platform.machine()], pid, thread, number) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_a_second_run_on_the_same_folder_is_refused(tmp_path, policy_matrix):
    first = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32", *SLOW, "--out", tmp_path)
    try:
        _worker_of(first, tmp_path / "cells" / "ort-cpu-fp32")
        done = policy_matrix([MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--out", tmp_path])
        assert done.returncode == 2 and "another policy-matrix run is writing to" in "\n".join(done.lines), done.lines
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=STATE_TIMEOUT_S)
    assert first.returncode == 143


def test_a_cell_whose_files_cannot_be_written_fails_alone(tmp_path, policy_matrix):
    (tmp_path / outdir.LOCK_FILE).touch()  # a report folder of the tool's (outdir.claim), a file planted in it
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "ort-cpu-fp16").write_text("a file where the cell's folder should go")
    done = policy_matrix(["run", MLP, "--targets", "ort-cpu", "--precisions", "fp32,fp16", "--iters", "5",
                          "--out", tmp_path])
    assert done.returncode == 1, done.stderr
    fp32, fp16 = load_results(tmp_path)["cells"]
    assert fp32["verdict"] == "PASS"
    assert fp16["verdict"] == "FAIL" and "cannot write the cell's files" in fp16["error"]["message"]


def _limit_file_size(nbytes: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


def test_a_write_error_leaves_the_previous_report_whole(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse any file above a limit (EFBIG): set between the largest
    other file a run writes and index.html, only the report itself cannot be written."""
    args = [MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "5", "--out", tmp_path]
    assert run_cli("run", *args).returncode == 0
    before = (tmp_path / "index.html").read_bytes()
    others = max(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and p.name != "index.html")
    assert len(before) > others + 1024, "index.html must be the largest file for this test"
    run = _start(*args, preexec_fn=_limit_file_size(others + 1024))
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    lines = [line for line in stderr.splitlines() if "error" in line]
    assert run.returncode == 2 and "Traceback" not in stderr
    assert len(lines) == 1 and "cannot write the report" in lines[0], stderr
    assert (tmp_path / "index.html").read_bytes() == before  # not truncated: replaced whole or not at all
    assert not list(tmp_path.glob(".*.partial"))


def test_memory_cap_makes_an_oversized_cell_fail_with_out_of_memory(tmp_path):
    # batch 15M: its observations (17 floats) and row index, 1.06 GiB, fit a 1.5 GiB cap (a larger batch is refused
    # up front, model.check_batch_sizes); the first hidden layer's 64 floats a row (3.6 GiB) do not.
    done = run_cli("run", MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "1", "--warmup", "0",
                   "--batch-sizes", "1,15000000", "--memory-limit", "1.5G", "--out", tmp_path)
    assert done.returncode == 1, done.stderr
    (cell,) = load_results(tmp_path)["cells"]
    assert cell["verdict"] == "FAIL" and cell["error"]["message"].startswith("out of memory (limit 1.5 GiB)"), cell["error"]


RESERVE_64_GIB = """
import ctypes
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PROT_NONE, MAP_PRIVATE_ANONYMOUS_NORESERVE = 0, 0x22 | 0x4000
address = libc.mmap(None, 64 << 30, PROT_NONE, MAP_PRIVATE_ANONYMOUS_NORESERVE, -1, 0)
raise SystemExit(0 if address not in (None, ctypes.c_void_p(-1).value) else 3)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA counts mappings this way on Linux")
def test_the_memory_cap_counts_memory_not_address_space_reservations():
    """CUDA, V8 and wasm reserve tens of GiB of inaccessible address space at start: under the cap
    that reservation must succeed (an address-space cap would stop them from starting at all)."""
    from matrix.run import isolation

    process = isolation.start([sys.executable, "-c", RESERVE_64_GIB], memory_limit=1 << 30, timeout_s=60)
    assert process.wait(timeout=60) == 0


def _endless_loop_model(folder: Path) -> Path:
    """A valid policy whose Loop runs 10^12 times: only a timeout ends its evaluation."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["b", 4])],
    )
    init = [numpy_helper.from_array(np.array(10**12, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go")]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "obs"], ["action"], body=body)], "endless",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 4])], init,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), folder / "endless.onnx")
    return folder / "endless.onnx"


def test_a_reference_that_never_ends_is_stopped_by_the_timeout(tmp_path):
    started = time.monotonic()
    done = run_cli("run", _endless_loop_model(tmp_path), "--targets", "ort-cpu", "--timeout", "5", "--out", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "float64 reference" in done.stderr and "timed out after 5 s" in done.stderr, done.stderr
    assert time.monotonic() - started < 120  # not the minutes an unguarded evaluation takes
    assert not _descendants_of_dead_run(tmp_path)


def _descendants_of_dead_run(out: Path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]


def test_require_and_fail_on_skip_make_an_all_skip_run_fail(tmp_path):
    args = [MLP, "--targets", "coreml-cpu", "--precisions", "fp32"]  # Core ML prediction SKIPs off macOS
    if sys.platform == "darwin":
        pytest.skip("coreml-cpu runs on macOS")
    assert run_cli("run", *args, "--out", tmp_path / "a").returncode == 0
    done = run_cli("-q", "run", *args, "--require", "coreml-cpu", "--out", tmp_path / "b")
    # -q silences progress, not this: CI must see why it failed, in the log, junit.xml and summary.md
    assert done.returncode == 1 and "required target coreml-cpu did not run" in done.stderr
    failures = [case.find("failure") for case in ET.parse(tmp_path / "b" / "junit.xml").getroot().iter("testcase")]
    assert any(f is not None and "required target coreml-cpu" in f.get("message") for f in failures)
    assert "required target coreml-cpu did not run" in (tmp_path / "b" / "summary.md").read_text()
    assert run_cli("run", *args, "--fail-on", "skip", "--out", tmp_path / "c").returncode == 1


def test_a_piped_run_logs_each_cell_as_it_finishes(tmp_path):
    """A CI log is not a terminal: one plain line per finished cell, and no line cut at 80 columns."""
    done = run_cli("run", MLP, "--targets", "ort-cpu,coreml-cpu", "--precisions", "fp32,fp16", "--iters", "5",
                   "--out", tmp_path / "a")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("cell ")]
    # targets run side by side: a target's cells finish in grid order, targets in any order
    assert sorted(line.split(":")[0] for line in lines) == ["cell coreml-cpu fp16", "cell coreml-cpu fp32",
                                                            "cell ort-cpu fp16", "cell ort-cpu fp32"]
    assert [line.split(":")[0] for line in lines if "ort-cpu" in line] == ["cell ort-cpu fp32", "cell ort-cpu fp16"]
    assert all(line.endswith(" s)") for line in lines)
    assert "cell coreml-cpu fp32: SKIP" in done.stderr or sys.platform == "darwin"
    assert "━" not in done.stderr  # no progress bars drawn into the log


def test_harness_server_answers_head_like_get(tmp_path):
    from targets.web_support import HarnessServer

    server = HarnessServer()
    try:
        for path in ("/harness/../../pyproject.toml", "/ort/../package.json", "/harness/%2e%2e/%2e%2e/README.md", "/"):
            request = urllib.request.Request(f"{server.origin}{path}", method="HEAD")
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(request)
        request = urllib.request.Request(f"{server.origin}/harness/index.html", method="HEAD")
        with urllib.request.urlopen(request) as reply:
            assert reply.status == 200 and int(reply.headers["Content-Length"]) > 0 and reply.read() == b""
    finally:
        server.stop()


def test_chromium_dies_with_a_killed_runner(tmp_path):
    from targets import REGISTRY

    if REGISTRY["ort-web-wasm"].unavailable_reason():
        pytest.skip(REGISTRY["ort-web-wasm"].unavailable_reason())
    run = _start(MLP, "--targets", "ort-web-wasm", "--precisions", "fp32", *SLOW, "--out", tmp_path)
    _worker_of(run, tmp_path / "cells" / "ort-web-wasm-fp32")
    browsers = _wait_for(lambda: _descendants(run.pid, "--remote-debugging-pipe"), "the worker's Chromium")
    run.kill()
    run.wait()
    _assert_gone(browsers)


def _stage(cell_dir: Path) -> str | None:
    try:
        return json.loads((cell_dir / "measurement.json").read_text()).get("stage")
    except (OSError, ValueError):  # not written yet
        return None


def test_the_web_targets_share_one_worker_and_a_dead_browser_costs_its_cell_only(tmp_path):
    """One worker serves the web targets (a browser context each); the browser killed mid-cell
    fails that cell only: the next target's cell gets a fresh browser in the same worker."""
    from targets import REGISTRY

    if REGISTRY["ort-web-wasm"].unavailable_reason():
        pytest.skip(REGISTRY["ort-web-wasm"].unavailable_reason())
    run = _start(MLP, "--targets", "ort-web-wasm,ort-web-webgl", "--precisions", "fp32", *SLOW, "--out", tmp_path)
    wasm_dir = tmp_path / "cells" / "ort-web-wasm-fp32"
    worker = _worker_of(run, wasm_dir)
    _wait_for(lambda: _stage(wasm_dir) == "latency", "the wasm cell timing")
    (browser,) = [p for p in _descendants(worker.pid, "--remote-debugging-pipe") if "--type=" not in " ".join(p.cmdline())]
    browser.kill()
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    wasm, webgl = load_results(tmp_path)["cells"]
    assert wasm["verdict"] == "FAIL" and wasm["error"]["stage"] == "latency", stderr
    assert webgl["verdict"] in ("PASS", "WARN"), webgl["reasons"]
    pids = {json.loads((tmp_path / "cells" / f"{name}-fp32" / "measurement.json").read_text())["worker_pid"]
            for name in ("ort-web-wasm", "ort-web-webgl")}
    assert pids == {worker.pid}


def test_watchdog_kills_a_group_whose_runner_is_gone():
    """The fallback where no parent-death signal exists: a separate watchdog process."""
    runner = subprocess.Popen(["sleep", "600"])
    group = subprocess.Popen(["sleep", "600"], start_new_session=True)
    watchdog = subprocess.Popen([sys.executable, "-m", "matrix.run.isolation", str(runner.pid), str(group.pid), "inf"])
    try:
        assert watchdog.poll() is None and group.poll() is None
        runner.kill()
        runner.wait()
        assert group.wait(timeout=STATE_TIMEOUT_S) == -signal.SIGKILL
        watchdog.wait(timeout=STATE_TIMEOUT_S)
    finally:
        for process in (runner, group, watchdog):
            if process.poll() is None:
                process.kill()


def test_watchdog_kills_a_group_past_its_timeout():
    runner = subprocess.Popen(["sleep", "600"])
    group = subprocess.Popen(["sleep", "600"], start_new_session=True)
    watchdog = subprocess.Popen([sys.executable, "-m", "matrix.run.isolation", str(runner.pid), str(group.pid), "1"])
    try:
        assert group.wait(timeout=STATE_TIMEOUT_S) == -signal.SIGKILL
        assert runner.poll() is None  # the runner itself is left alone
    finally:
        for process in (runner, group, watchdog):
            if process.poll() is None:
                process.kill()
        runner.wait()


def _allocates_at_run_time(folder: Path) -> Path:
    """A policy that allocates max(obs) * 2^28 floats per call: no declared shape says so,
    only running it shows (the seeded observations reach 10, so about 10 GB)."""
    nodes = [
        helper.make_node("ReduceMax", ["obs"], ["top"], keepdims=0),
        helper.make_node("Mul", ["top", "scale"], ["count_f"]),
        helper.make_node("Cast", ["count_f"], ["count"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["count", "one"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
        helper.make_node("Add", ["obs", "total"], ["action"]),
    ]
    init = [numpy_helper.from_array(np.array(float(1 << 28), np.float32), "scale"),
            numpy_helper.from_array(np.array([1], np.int64), "one")]
    graph = helper.make_graph(nodes, "greedy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 4])], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), folder / "greedy.onnx")
    return folder / "greedy.onnx"


def test_the_reference_runs_under_the_memory_cap(tmp_path):
    done = run_cli("run", _allocates_at_run_time(tmp_path), "--targets", "ort-cpu", "--memory-limit", "1G",
                   "--out", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "float64 reference" in done.stderr and "out of memory (limit 1 GiB)" in done.stderr, done.stderr


def test_a_write_error_before_any_cell_is_one_line(tmp_path):
    # 4 kB per file: observations.npz (~9 kB) cannot be written.
    run = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32", "--out", tmp_path, preexec_fn=_limit_file_size(4_000))
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("reference")]
    assert run.returncode == 2 and "Traceback" not in stderr, stderr
    assert len(lines) == 1 and f"cannot write {tmp_path}" in lines[0] and "File too large" in lines[0], stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs mounted for the test and removed after it; skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Write until the disk is full (ENOSPC); the filler file is returned so the test can free the space."""
    filler = disk / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(descriptor, b"\0" * (1 << 20))
    except OSError as error:
        assert error.errno == errno.ENOSPC, error
    finally:
        os.close(descriptor)
    return filler


def test_a_full_disk_then_resume_reruns_what_the_disk_cost(small_disk):
    """The disk fills once the first cell is in the journal and before the next one is: the later cells
    fail on the tool's own writes (ENOSPC), the journal and report cannot be written. With space again,
    --resume keeps the first cell as measured and runs the others again instead of keeping their disk-made
    FAILs. The run's processes are stopped while the disk fills, so no later cell can finish before it is full."""
    out = small_disk / "out"
    args = ["--targets", "ort-cpu", "--precisions", "fp32,fp16,int8", "--iters", "20000", "--warmup", "0",
            "--batch-sizes", "1"]
    run = _start(MLP, *args, "--out", out)
    _wait_for(lambda: len(_jsonl(out)) >= 1, "the first finished cell in results.jsonl")
    with _stopped(run.pid):
        filler = _fill(small_disk)
    _, stderr = run.communicate(timeout=STATE_TIMEOUT_S)
    assert "Traceback" not in stderr, stderr
    kept = _jsonl_lines_parsed(out)
    assert kept and kept[0]["variant"] == "fp32" and kept[0]["verdict"] == "PASS"
    filler.unlink()
    done = run_cli("run", MLP, *args, "--resume", out)
    assert done.returncode == 0, done.stderr
    assert re.search(r"keeping [12] finished cells", done.stderr), done.stderr  # at least the last cell runs again
    results = load_results(out)
    assert [(c["variant"], c["verdict"]) for c in results["cells"]] == [("fp32", "PASS"), ("fp16", "PASS"), ("int8", "PASS")]
    assert results["cells"][0]["duration_s"] == kept[0]["duration_s"]  # kept, not measured again
    assert all(json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())  # no line glued to a cut one


@contextlib.contextmanager
def _stopped(pid: int):
    """SIGSTOP for a process and its descendants while the block runs, SIGCONT after."""
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.suspend()
    try:
        yield
    finally:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()


def _jsonl_lines_parsed(out: Path) -> list[dict]:
    """The journal's whole lines (a line cut by the full disk is left out)."""
    lines = []
    for raw in (out / "results.jsonl").read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return lines


def test_merge_into_a_folder_a_run_is_writing_is_refused(tmp_path, policy_matrix):
    shard = Path(__file__).parent / "fixtures" / "shard_continuous_mlp.json"
    out = tmp_path / "out"
    run = _start(MLP, "--targets", "ort-cpu", "--precisions", "fp32", *SLOW, "--out", out)
    try:
        _worker_of(run, out / "cells" / "ort-cpu-fp32")
        done = policy_matrix(["merge", shard, "--out", out])
        assert done.returncode == 2 and "another policy-matrix run is writing to" in "\n".join(done.lines), done.lines
        assert not (out / "results.json").exists()  # the run's report was not replaced by the merge
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=STATE_TIMEOUT_S)
    assert run.returncode == 143
