"""Start the tool's Python jobs by forking a pre-warmed process instead of starting an interpreter.

Every cell worker, reference job and guarded step is `python -m MODULE ARGS` of this
interpreter, and each used to pay for its own start: an interpreter plus numpy, onnx
(ml_dtypes) and onnxruntime, 0.6-1 s on an idle 2-core machine, several seconds on a busy
one. The fork server imports them once; `isolation.start` asks it for `python -m MODULE
ARGS` and gets a process that is still entirely its own: its own session (the group a
timeout kills), its own memory cap (RLIMIT_DATA, set in the child after the fork, before
any job code runs), its own stdin/stdout/stderr, death with the runner (the server dies
with the runner; each child dies with the server) and its own exit status, signal
included: a SIGSEGV in a child costs that child only, as before.

Why our own small server and not multiprocessing's forkserver (`set_forkserver_preload`):
that one runs a pickled callable after `spawn.prepare` (which may re-import the parent's
main module in every child) and gives children the server's stdio; the jobs here are
modules with a command line, whose stdout carries the stage protocol and whose stderr is
the cell's log. This server keeps exactly the `python -m` contract, so a forked child runs
the same code as an exec'd one, and hands each child its three stdio descriptors over the
socket (SCM_RIGHTS), the one thing the standard library's server does not do.

A program run's server is the runner itself, forked at its entry point once numpy, onnx, pydantic and the results'
schemas are imported (both need them; an interpreter of its own imported them again, ~0.6 CPU s of a single check's
~2.1): in its own
session, dying with the runner, stdin and stdout on /dev/null, none of the runner's descriptors but stderr. Elsewhere
(a test calling the command line in its own process, a process with another thread) it is
`python -m matrix.run.forkserver FD`, as the same server. A forked server writes its children's titles over the
runner's command line, so a very short one (`python -m matrix run m.onnx` typed with a bare `python`) shows them cut.

Linux only (SOCK_SEQPACKET, the parent-death signal); elsewhere, and for a job whose
environment changes what an interpreter imports (a pinned onnxruntime release on
PYTHONPATH), `isolation.start` starts an interpreter as before.

Run as `python -m matrix.run.forkserver FD` it is the server, FD its end of the control socket.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading

# What the jobs import, in the order a run needs them: everything the reference job imports first (its
# evaluator's ~200 operator modules, `onnx.reference.ops`, cost each reference job ~0.2 s when not preloaded; its
# own modules, REFERENCE_ENTRIES), then what only the cell workers import (pydantic, the results' schemas and the
# rollouts, which a reference job without --env or --trajectory has no use for; numpy.ma, which np.percentile
# imports on its first call, 15-50 ms of a worker's latency percentiles; the worker's module). One module per step,
# the large ones apart (pydantic's model machinery and the results' schemas take 0.1-0.3 s each): a request waits
# for the step under way only, and a run asks for its reference job about when the server reaches the workers'
# steps. The jobs' own modules are imported too, then dropped from sys.modules, so each child runs its entry
# module fresh as __main__ (runpy warns about a module already imported).
REFERENCE_PRELOAD = ("numpy", "numpy.random", "onnx", "onnx.reference", "onnx.reference.ops", "onnxruntime",
                     "matrix.reference.reference")
REFERENCE_ENTRIES = ("matrix.reference.reference_job", "matrix.run.guarded")
WORKER_PRELOAD = ("pydantic", "pydantic.main", "matrix.results", "matrix.run.rollouts", "numpy.ma")
WORKER_ENTRIES = ("matrix.run.worker",)
PRELOAD = REFERENCE_PRELOAD + WORKER_PRELOAD
# What a run's runner imports as well on its way to the reference job (numpy.random: the seeded observations;
# matrix.reference.reference: the reference's arrays): a server forked from it (Client.warm) is forked once they are
# loaded, and once onnx's operator schemas are registered (warm_operator_schemas), so the server's own imports, which
# the reference job waits for, are only what the runner has no use for.
SHARED_WITH_THE_RUNNER = ("numpy", "numpy.random", "onnx", "pydantic", "matrix.results", "matrix.run.rollouts",
                          "matrix.reference.reference")
ENTRY_MODULES = REFERENCE_ENTRIES + WORKER_ENTRIES
# An environment whose value of these differs from the server's changes what the child would import:
# the interpreter's and the native libraries' own, and the pinned releases' (targets/versions.py; a pinned
# npm release's node_modules is read when targets.web_support is imported).
IMPORT_ENV_PREFIXES = ("PYTHON", "LD_", "OMP_", "OPENBLAS_", "MKL_", "POLICY_MATRIX_PINNED", "POLICY_MATRIX_NODE_MODULES")
MAX_REQUEST = 1 << 20
HELD_DURING_FORK = {signal.SIGINT, signal.SIGTERM}  # see Client._fork
READY = b"ready"
STARTUP_TIMEOUT_S = 120.0
# The server's last argument: room in its command line for each child's own (`ps` and tests see
# `python -m matrix.run.worker --serve`, not the server's line); set_title writes over it.
TITLE_ROOM = "-" * 4096


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "SOCK_SEQPACKET")


def module_of(command: list[str]) -> str | None:
    """MODULE when `command` is `python -m MODULE ...` of this interpreter (what a child of the server can run)."""
    if len(command) >= 3 and command[0] == sys.executable and command[1] == "-m":
        return command[2]
    return None


def pause_collection() -> None:
    """No cyclic garbage collection while a process imports what it will keep: the imports make ~1M objects that
    live as long as the process, and each collection among them (a full one, a dozen of the middle generation)
    traverses them for nothing: 0.1-0.2 s of the runner's start-up and as much of the server's. Resumed by
    `resume_collection`; a process whose imports never end (bad input) ends with collection still paused."""
    global _collection_paused
    gc.disable()
    _collection_paused = True


def resume_collection() -> None:
    """Collection again, after `pause_collection`: what was imported is frozen first (gc.freeze), so no later
    collection traverses it again, and a forked child's collections never touch (and copy) the server's pages.
    Does nothing in a process that did not pause (the tests run the command line in their own process)."""
    global _collection_paused
    if _collection_paused:
        gc.freeze()
        gc.enable()
        _collection_paused = False


_collection_paused = False


def warm_operator_schemas() -> None:
    """onnx registers its operator schemas on first use (~10 ms): the runner's model check and the server's evaluator
    (onnx.reference reads them as it loads) both use them, so they are registered once, before the server is forked,
    and the reference job is asked for that much sooner after the server's imports."""
    import onnx.defs

    onnx.defs.has("Relu")


def warm_reference_operators() -> None:
    """onnx.reference finds its operators' implementations when a process makes its first evaluator: subclass
    checks over every operator class, ~20 ms of each reference job (and of each diagnosis) when the server left
    them to the job, a third of the MLP's. A step of the server's preload: found once, for every job it forks."""
    from onnx.reference.ops import load_op

    load_op("", "Identity")


def _import_env(env) -> dict[str, str]:
    """The variables that change what an interpreter imports (a pinned release on PYTHONPATH, BLAS threads)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)}


# --- the runner's side ------------------------------------------------------------------


class ForkedProcess:
    """What `subprocess.Popen` offers the callers of `isolation.start`: pid, stdin/stdout, poll, wait, returncode.
    The exit status arrives over the job's own channel from the server, which is its parent."""

    def __init__(self, args: list[str], pid: int, channel: socket.socket, buffered: bytes, stdin, stdout):
        self.args, self.pid, self.returncode = args, pid, None
        self.stdin, self.stdout = stdin, stdout
        self._channel, self._buffer = channel, buffered
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if self.returncode is None:
                line = _read_line(self._channel, self._buffer, timeout)
                if line is None:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                # no status: the server died, and its children with it (parent-death signal)
                self.returncode = int(line) if line else -signal.SIGKILL
                self._channel.close()
            return self.returncode


def _read_line(channel: socket.socket, buffered: bytes, timeout: float | None) -> str | None:
    """The status line; "" when the server closed the channel without one; None on the timeout."""
    data = buffered
    while b"\n" not in data:
        ready, _, _ = select.select([channel], [], [], timeout)
        if not ready:
            return None
        chunk = channel.recv(64)
        if not chunk:
            return ""
        data += chunk
    return data.split(b"\n", 1)[0].decode()


class Client:
    """The runner's connection to its fork server, started on first use (or early by `warm`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._ready = self._broken = self._fork_from_here = False
        self._imports: dict[str, str] = {}

    def warm(self, *, fork_from_here: bool = False) -> None:
        """Start the server now, so its imports overlap the runner's own work. `fork_from_here`: the server is
        this process forked once it has imported what the runner needs as well (SHARED_WITH_THE_RUNNER), instead
        of an interpreter of its own that imports them again (~0.6 CPU s). Only where this process is the program (the
        entry point, before anything else; not a test's process) and has no other thread: a thread's lock taken
        at the fork would stay taken in the server for good."""
        with self._lock:
            self._fork_from_here = fork_from_here and supported() and threading.active_count() == 1
            self._ensure_started(wait=False)

    def start(self, command: list[str], *, env: dict[str, str], memory_limit: int | None, death_signal: bool,
              stdin=None, stdout=None, stderr=None, text: bool = False) -> ForkedProcess | None:
        """`command` (python -m MODULE ...) forked from the server; None when the server is not available."""
        request = json.dumps({"argv": command[2:], "env": env, "cwd": os.getcwd(), "memory_limit": memory_limit,
                              "death_signal": death_signal}).encode()
        with self._lock:
            if not self._ensure_started(wait=True) or _import_env(env) != self._imports:
                return None  # no server, or a fresh interpreter would import something else than it did
            ends = _Stdio(stdin, stdout, stderr, text)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(self._control, [request], [theirs.fileno(), *ends.child_fds()])
            except OSError:
                ends.close_all()
                ours.close()
                return None
            finally:
                theirs.close()
                ends.close_child_ends()
        data = b""
        while b"\n" not in data:  # the pid, sent once the child has its session and its limits
            chunk = ours.recv(64)
            if not chunk:  # the server died before it forked
                ends.close_parent_ends()
                ours.close()
                return None
            data += chunk
        pid, rest = data.split(b"\n", 1)
        return ForkedProcess(command, int(pid), ours, rest, ends.parent_stdin, ends.parent_stdout)

    def _ensure_started(self, wait: bool) -> bool:
        if self._broken:
            return False
        if self._server is None or self._server.poll() is not None:
            self._broken = not self._launch()
            if self._broken:
                return False
        return self._await_ready() if wait else True

    def _launch(self) -> bool:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fork, self._fork_from_here = self._fork_from_here, False  # once: a server started again starts afresh
        self._server = self._fork(ours, theirs) if fork else self._start(theirs)
        theirs.close()
        if self._server is None:
            ours.close()
            return False
        self._control, self._ready, self._imports = ours, False, _import_env(os.environ)
        return True

    @staticmethod
    def _fork(ours: socket.socket, theirs: socket.socket) -> ForkedServer | None:
        """This process forked, after the imports both sides need, to be the server (see warm)."""
        import importlib

        for name in SHARED_WITH_THE_RUNNER:
            importlib.import_module(name)
        warm_operator_schemas()
        runner = os.getpid()
        # A Ctrl-C reaching the runner's group during the fork would find the child inside os.fork's own at-fork hooks
        # (random's reseed), where Python can only print it as "Exception ignored in ..." with a traceback: it waits,
        # blocked, until the child has its session (_serve_forked) and the parent is back here.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_DURING_FORK)
        try:
            pid = os.fork()
            if pid == 0:
                _serve_forked(ours, theirs, runner, mask)
        except OSError:
            return None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return ForkedServer(pid)

    @staticmethod
    def _start(theirs: socket.socket) -> subprocess.Popen | None:
        """An interpreter of its own, started from a thread that lives as long as the server: the parent-death
        signal follows the thread that started a process, and a pool thread that ends (the variants' pool)
        would take the server with it."""
        from . import isolation  # isolation routes through this module; the server itself is a plain start

        started: queue.Queue = queue.Queue()

        def keep() -> None:
            try:
                server = isolation.start_dying_with_parent(
                    [sys.executable, "-m", "matrix.run.forkserver", str(theirs.fileno()), TITLE_ROOM], pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            except OSError:
                started.put(None)
                return
            started.put(server)
            server.wait()

        threading.Thread(target=keep, name="forkserver", daemon=True).start()
        return started.get()

    def _await_ready(self) -> bool:
        if self._ready:
            return True
        ready, _, _ = select.select([self._control], [], [], STARTUP_TIMEOUT_S)
        self._ready = bool(ready) and self._control.recv(len(READY)) == READY
        if not self._ready:
            self.stop_server()
        return self._ready

    def stop_server(self) -> None:
        """End of requests: the server exits, and the children still running with it (parent-death signal)."""
        if self._server is not None:
            from . import isolation

            self._control.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._server.wait(timeout=5)
            isolation.kill_group(self._server)
            self._server = None


class ForkedServer:
    """The server forked from the runner (Client.warm): what the client and isolation.kill_group use of a Popen."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            pidfd = os.pidfd_open(self.pid)  # readable once the process has ended
            try:
                select.select([pidfd], [], [], timeout)
            finally:
                os.close(pidfd)
            if self.poll() is None:
                raise subprocess.TimeoutExpired(["matrix.run.forkserver"], timeout)
        return self.returncode


class _Stdio:
    """The three descriptors a child gets, made like Popen's: PIPE, DEVNULL, a file, a descriptor or inherited."""

    def __init__(self, stdin, stdout, stderr, text: bool):
        self._opened: list[int] = []
        self.parent_stdin = self.parent_stdout = None
        self._child: list[int] = []
        for index, (wanted, reading) in enumerate(((stdin, False), (stdout, True), (stderr, True))):
            if wanted == subprocess.PIPE and index < 2:
                read_end, write_end = os.pipe()
                child_end, parent_end = (write_end, read_end) if reading else (read_end, write_end)
                mode = "r" if reading else "w"
                stream = os.fdopen(parent_end, mode) if text else os.fdopen(parent_end, mode + "b", buffering=0)
                if reading:
                    self.parent_stdout = stream
                else:
                    self.parent_stdin = stream
                self._opened.append(child_end)
                self._child.append(child_end)
            elif wanted == subprocess.DEVNULL:
                self._opened.append(os.open(os.devnull, os.O_RDWR))
                self._child.append(self._opened[-1])
            elif wanted is None:
                self._child.append(index)
            else:
                self._child.append(wanted if isinstance(wanted, int) else wanted.fileno())

    def child_fds(self) -> list[int]:
        return self._child

    def close_child_ends(self) -> None:
        for fd in self._opened:
            os.close(fd)
        self._opened = []

    def close_parent_ends(self) -> None:
        for stream in (self.parent_stdin, self.parent_stdout):
            if stream is not None:
                stream.close()

    def close_all(self) -> None:
        self.close_child_ends()
        self.close_parent_ends()


CLIENT = Client()


# --- the server -------------------------------------------------------------------------


def serve(control: socket.socket, preload: list) -> None:
    """Fork one child per request; tell each request's channel the child's pid, then its exit status.

    Ready at once; the imports (`preload`, one step at a time) happen while no request waits. A job asked
    for before they are done (a run's reference job, often) is forked with what is loaded so far and imports
    the rest itself, instead of waiting for the imports of every kind of job. A child's exit status is sent
    as it ends, also in the middle of a step: SIGCHLD's handler reaps it (Python runs the handler between two
    bytecodes of the import under way), where a status read between steps only waited for the step (a run's
    reference job was told ended 5-10 ms late, while the server imported the workers' modules)."""
    children: dict[int, socket.socket] = {}
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    # The kernel may give SIGCHLD to any thread (OpenBLAS's, numpy's): the handler still runs in the main thread,
    # and the wakeup descriptor wakes the main thread's select, which the signal itself then does not interrupt.
    signal.set_wakeup_fd(wakeup_write)
    forking = False

    def child_ended(*_) -> None:
        if not forking:  # while a child is forked and recorded, the loop reaps after it: no status without its channel
            _reap(children)

    signal.signal(signal.SIGCHLD, child_ended)
    control.send(READY)
    while True:
        ready, _, _ = select.select([control, wakeup_read], [], [], 0 if preload else None)  # retried after a handler
        if wakeup_read in ready:
            os.read(wakeup_read, 4096)  # the handler has reaped: this only woke the loop
        if control in ready:
            message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 4)
            if not message:  # the runner closed its end: no more jobs
                return
            forking = True
            try:
                _fork(json.loads(message), fds, children)
            finally:
                forking = False
            _reap(children)
        elif preload and not ready:
            with contextlib.suppress(Exception):  # a module that cannot load fails the job that needs it, in its log
                preload.pop(0)()
            if not preload:
                resume_collection()


def run_server(control: socket.socket) -> None:
    """The server's life, in an interpreter of its own or forked from the runner. The runner may be gone while
    the imports run (it stopped on bad input): nobody is left to serve or to read a traceback, so the server
    ends as quietly as a closed socket."""
    pause_collection()
    set_title([sys.executable, "-m", "matrix.run.forkserver"])
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        serve(control, preload_steps())


def _serve_forked(runners: socket.socket, control: socket.socket, runner_pid: int, mask: set) -> None:
    """Never returns: the runner's child becomes the server, as `start_dying_with_parent` would have started it
    (its own session, death with the runner, stdin and stdout on /dev/null, no descriptor of the runner's but
    stderr and the control socket). From the fork on, whatever happens ends here: a Ctrl-C reaching it before it
    has a session of its own, as the runner's group, would otherwise unwind the runner's stack in the child (a
    second traceback, or a second runner)."""
    code = 1
    try:
        from . import isolation

        runners.close()
        os.setsid()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C held during the fork ends the server here
        isolation.limit_this_process(None, runner_pid)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.closerange(3, control.fileno())
        os.closerange(control.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
        run_server(control)
        code = 0
    finally:
        os._exit(code)


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel = children.pop(pid, None)
        if channel is not None:
            with contextlib.suppress(OSError):
                channel.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            channel.close()


def _fork(request: dict, fds: list[int], children: dict[int, socket.socket]) -> None:
    channel_fd, stdio = fds[0], fds[1:]
    ready_read, ready_write = os.pipe()
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(request, stdio, ready_write, server_pid)
    os.close(ready_write)
    os.read(ready_read, 1)  # the child has its session and limits (or died trying): a kill now reaches its group
    os.close(ready_read)
    for fd in stdio:
        os.close(fd)
    channel = socket.socket(fileno=channel_fd)
    with contextlib.suppress(OSError):
        channel.sendall(f"{pid}\n".encode())
    children[pid] = channel


def _child(request: dict, stdio: list[int], ready_write: int, server_pid: int) -> None:
    """Never returns: runs `python -m MODULE ARGS` in this process and exits with its status."""
    import traceback

    from . import isolation

    code = 1
    try:
        resume_collection()  # forked during the imports: the job collects its own garbage, never the server's objects
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        isolation.limit_this_process(request["memory_limit"], server_pid if request["death_signal"] else None)
        os.write(ready_write, b"1")
        for target, fd in enumerate(stdio):
            if fd != target:
                os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nothing of the server's or another job's reaches this one
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        set_title([sys.executable, "-m", *request["argv"]])
        code = _run_module(request["argv"])
    except MemoryError:  # under the cap even a traceback may not fit: the words an interpreter would leave, unallocated
        os.write(2, b"MemoryError: out of memory\n")
    except BaseException:  # as an interpreter would: the traceback on stderr, status 1
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_module(argv: list[str]) -> int:
    """The module's exit status; an exception it raises goes to the caller (_child), as to an interpreter."""
    import runpy

    import numpy as np

    np.random.seed()  # like a fresh interpreter: not the server's generator state, copied into every child
    sys.argv = ["-m", *argv[1:]]
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    return 0


def set_title(argv: list[str]) -> None:
    """This process's command line as `ps` and /proc/PID/cmdline show it, written over the original argv
    strings (arg_start..arg_end of /proc/self/stat, Linux) as setproctitle does: one line, words apart by
    spaces, cut to the room there is, ended by a NUL; the room's last byte is not a NUL, which tells the
    kernel to show the line up to its NUL rather than the whole room."""
    import ctypes

    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5), counted after "pid (comm)"
    except (OSError, ValueError, IndexError):
        return
    room = end - start
    title = " ".join(argv).encode()[: room - 2]
    ctypes.memmove(start, title + b"\0" * (room - len(title) - 1) + b" ", room)


def preload_steps() -> list:
    """One import per step. An entry module's step drops every entry module from sys.modules (one may import
    another: the reference job imports matrix.run.guarded), so no child is forked with one already there."""
    import functools
    import importlib

    def entry(name: str) -> None:
        importlib.import_module(name)
        for loaded in ENTRY_MODULES:
            sys.modules.pop(loaded, None)

    return [*(functools.partial(importlib.import_module, name) for name in REFERENCE_PRELOAD),
            warm_reference_operators,
            *(functools.partial(entry, name) for name in REFERENCE_ENTRIES),
            *(functools.partial(importlib.import_module, name) for name in WORKER_PRELOAD),
            *(functools.partial(entry, name) for name in WORKER_ENTRIES)]


if __name__ == "__main__":
    run_server(socket.socket(fileno=int(sys.argv[1])))
