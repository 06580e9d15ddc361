"""The fork server forked from the runner itself (forkserver.Client.warm(fork_from_here=True), what a program run
does): it must be as contained as the interpreter it replaces, and its jobs as their own as before."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, subprocess, sys, threading
import psutil
from matrix.run import forkserver

if sys.argv[1] == "thread":  # a thread's lock taken at a fork would stay taken in the server: no fork then
    threading.Thread(target=threading.Event().wait, daemon=True).start()

kept_read, kept_write = os.pipe()  # a descriptor of the runner's: the server must not hold it open
forkserver.CLIENT.warm(fork_from_here=True)
job = forkserver.CLIENT.start([sys.executable, "-m", "json.tool"], env=dict(os.environ), memory_limit=1 << 30,
                              death_signal=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
(server,) = [p for p in psutil.Process().children() if p.pid != job.pid]
fds = {}
for fd in os.listdir(f"/proc/{server.pid}/fd"):
    try:
        fds[int(fd)] = os.readlink(f"/proc/{server.pid}/fd/{fd}")
    except FileNotFoundError:  # closed since listed: a module file the server, still importing, read meanwhile
        pass
found = {
    # what only a fork of this process has: psutil's extension, imported here and never by the server's modules
    "server_has_our_imports": "_psutil_linux" in open(f"/proc/{server.pid}/maps").read(),
    "job_parent": psutil.Process(job.pid).ppid() == server.pid, "job_session": os.getsid(job.pid) == job.pid,
    "server_parent": server.ppid() == os.getpid(), "server_session": os.getsid(server.pid) == server.pid,
    "server_stdin_stdout": [fds.get(0), fds.get(1)], "server_stderr_is_ours": fds.get(2) == os.readlink("/proc/self/fd/2"),
    "server_holds_our_pipe": os.readlink(f"/proc/self/fd/{kept_write}") in fds.values(),
}
job.stdin.write('{"a": 1}')
job.stdin.close()
found["job_printed"] = json.loads(job.stdout.read())
found["job_status"] = job.wait()
print(json.dumps(found))
"""


@pytest.mark.parametrize("threads", ["one", "thread"])
def test_a_server_forked_from_the_runner_holds_nothing_of_its_but_stderr_and_its_jobs_are_their_own(threads):
    done = subprocess.run([sys.executable, "-c", PROBE, threads], capture_output=True, text=True, check=True, timeout=300)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "server_has_our_imports": threads == "one",  # with another thread, an interpreter of its own
        "job_parent": True, "job_session": True, "job_printed": {"a": 1}, "job_status": 0,
        "server_parent": True, "server_session": True,
        "server_stdin_stdout": ["/dev/null", "/dev/null"], "server_stderr_is_ours": True,
        "server_holds_our_pipe": False,  # (what it holds besides is its own, and changes as it imports)
    }


def test_what_the_server_is_forked_after_is_what_a_run_imports_anyway():
    # Anything else would be imported on the runner's way to its reference for the server's sake only: the
    # orchestrator's modules, and what making the seeded observation set loads.
    probe = ("import sys\nfrom matrix.run import forkserver, orchestrate\n"
             "from matrix.inputs import examples, model, observations\n"
             "observations.seeded(model.load(examples.path('continuous_mlp')), 1, 0)\n"
             "print(sorted(set(forkserver.SHARED_WITH_THE_RUNNER) - set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "[]"
