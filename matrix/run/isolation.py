"""Every model-dependent process runs under the same protection: its own process group,
a memory cap, a timeout, and death with the runner.

- memory: RLIMIT_DATA in the child (private writable memory: heap and anonymous
  mappings, Linux >= 4.7), so an allocation beyond the cap fails inside that
  process (MemoryError, std::bad_alloc) instead of growing the runner or waking
  the host's OOM killer; `resource` is in the standard library, no cgroup setup
  or privileges needed. Not RLIMIT_AS: CUDA, V8 and wasm runtimes reserve far
  more address space than they ever use (inaccessible reservations), and an
  address-space cap makes them fail to start at all.
- death with the runner: on Linux the child asks the kernel for SIGKILL when
  its parent dies (prctl PR_SET_PDEATHSIG), which holds even on kill -9 of the
  runner. Elsewhere a small watchdog process kills the child's group when the
  runner is gone or the timeout has passed, so an orphan never outlives it.

Run as `python -m matrix.run.isolation RUNNER_PID PGID SECONDS` it is that watchdog.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import forkserver
from ..errors import InputError
from ..options import memory_text

PR_SET_PDEATHSIG = 1
WATCHDOG_GRACE_S = 5.0


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def has_parent_death_signal() -> bool:
    return _LIBC is not None


def limit_this_process(memory_limit: int | None, parent_pid: int | None) -> None:
    """In a new child, before it runs any job code: the memory cap, and death with `parent_pid` (None: no
    parent-death signal here). Only async-signal-safe, pre-bound calls: it also runs between fork and exec."""
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, memory_limit))
    if parent_pid is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the request took effect
            os._exit(137)


def _child_setup(memory_limit: int | None, parent_pid: int, death_signal: bool):
    def setup() -> None:
        limit_this_process(memory_limit, parent_pid if death_signal else None)

    return setup


@contextlib.contextmanager
def capped_runner(memory_limit: int, doing: str):
    """The runner itself under the cap while it reads the user's files (the model, its external data,
    observations, a trajectory): what it holds already plus `memory_limit`, so no file can make the
    kernel kill it; an allocation beyond it is one line. Scoped, because helpers started later
    (a browser, npm, the converter environments) must not inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    in_use = _data_in_use()
    if in_use is None:  # RLIMIT_DATA counts heap and anonymous mappings this way on Linux only
        yield
        return
    cap = in_use + memory_limit if hard == resource.RLIM_INFINITY else min(in_use + memory_limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield
    except MemoryError:
        raise InputError(f"{doing} needs more memory than the limit {memory_text(memory_limit)} "
                         "(--memory-limit): refused") from None
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _data_in_use() -> int | None:
    """This process's private data (VmData), the quantity RLIMIT_DATA limits."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def start(command: list[str], *, memory_limit: int | None, timeout_s: float, **popen):
    """A process in a new session with the memory cap and death-with-parent; on hosts without a
    parent-death signal, a watchdog enforces the same. `python -m MODULE` of this interpreter is forked
    from the pre-warmed fork server (matrix.run.forkserver) when it can be, with the same guarantees;
    anything else is an interpreter or program of its own (Popen)."""
    process = _forked(command, memory_limit, popen) or _popen(command, memory_limit, popen)
    if not has_parent_death_signal():
        watch(process.pid, timeout_s)
    return process


def _forked(command: list[str], memory_limit: int | None, popen: dict):
    env = popen.get("env") or dict(os.environ)
    plain = set(popen) <= {"stdin", "stdout", "stderr", "text", "env"} and popen.get("stderr") not in (
        subprocess.PIPE, subprocess.STDOUT)
    if not (forkserver.supported() and plain and forkserver.module_of(command)):
        return None
    return forkserver.CLIENT.start(command, env=env, memory_limit=memory_limit, death_signal=has_parent_death_signal(),
                                   stdin=popen.get("stdin"), stdout=popen.get("stdout"), stderr=popen.get("stderr"),
                                   text=bool(popen.get("text")))


def _popen(command: list[str], memory_limit: int | None, popen: dict) -> subprocess.Popen:
    death_signal = has_parent_death_signal()
    return subprocess.Popen(
        command, start_new_session=True, preexec_fn=_child_setup(memory_limit, os.getpid(), death_signal), **popen
    )


def start_dying_with_parent(command: list[str], **popen) -> subprocess.Popen:
    """A long-lived helper (e.g. the run's browser, the fork server): no memory cap, but gone with the runner."""
    process = _popen(command, None, popen)
    if not has_parent_death_signal():
        watch(process.pid, float("inf"))
    return process


def watch(pgid: int, timeout_s: float) -> subprocess.Popen:
    """A watchdog for `pgid`, independent of this process (it survives our kill -9)."""
    limit = "inf" if timeout_s == float("inf") else f"{timeout_s + WATCHDOG_GRACE_S:.1f}"
    return subprocess.Popen(
        [sys.executable, "-m", "matrix.run.isolation", str(os.getpid()), str(pgid), limit],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started in its group; reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watchdog(runner_pid: int, pgid: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while _alive(pgid) and _alive(runner_pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    _watchdog(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
