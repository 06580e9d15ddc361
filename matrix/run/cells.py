"""Run one cell in a worker process with a timeout.

The worker leaves plain files (matrix/run/protocol.py: spec in, `Measurement` and
outputs out); this side validates them into a `CellOutcome`, which the run's
Judge (matrix/judge/judge.py) turns into a `Cell`. A worker that crashes, hangs or
runs out of memory becomes that cell's FAIL row with what is known.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path


from . import guarded, isolation
from ..inputs import observations
from ..inputs.observations import Feeds
from .protocol import DONE, GO, LOG_FILE, MEASUREMENT_FILE, OUTPUTS_FILE, START, TIMED, UNTIMED, CellSpec, Measurement
from ..results import Cell, CellError


@dataclass
class CellOutcome:
    measurement: Measurement
    arrays: Feeds
    duration_s: float

    @classmethod
    def failed(cls, stage: str, message: str) -> CellOutcome:
        """The core itself could not run the cell (no service, no cell folder): nothing was measured."""
        return cls(Measurement(stage=stage, error=CellError(stage=stage, message=message)), {}, 0.0)


def execute(
    cell_dir: Path, spec: CellSpec, env: dict[str, str], timeout_s: float, on_stage, memory_limit: int | None = None,
    worker: WorkerProcess | None = None,
) -> CellOutcome:
    """Run the cell in `worker` (a fresh worker process of its own when None); on_stage(name) is
    called as it reports progress. Files that cannot be written (a full disk) make this cell's
    FAIL; the run goes on."""
    try:
        _prepare_cell_dir(cell_dir, spec)
    except OSError as error:
        return CellOutcome.failed(START, name_tool_io(f"cannot write the cell's files: {error}"))
    if worker is not None:
        ending = worker.serve(cell_dir, {**os.environ, **env}, timeout_s, on_stage)
    else:
        command = [sys.executable, "-m", "matrix.run.worker", str(cell_dir)]
        ending = guarded.run_process(command, cell_dir / LOG_FILE, {**os.environ, **env}, guarded.Limits(timeout_s, memory_limit),
                                     on_stage)
    return CellOutcome(_measurement(cell_dir, ending), _arrays(cell_dir), ending.duration_s)


def _prepare_cell_dir(cell_dir: Path, spec: CellSpec) -> None:
    cell_dir.mkdir(parents=True, exist_ok=True)
    for stale in (MEASUREMENT_FILE, OUTPUTS_FILE):
        (cell_dir / stale).unlink(missing_ok=True)
    spec.write(cell_dir)


class GateClosed(Exception):
    """The run is being interrupted: no stage is granted any more."""


class StageGate:
    """Untimed work side by side, timed work alone.

    Serving workers of several targets run at once; each asks before a stage (protocol.gate_message).
    Untimed stages (prepare, opening a session or a page, contract, parity, rollouts, placement), a
    worker's start and the runner's judging share the machine; a timed one (latency, cold start) waits until nothing
    else runs and holds everything else off until it is done, so p50/p99 mean what they meant when
    cells ran one after another. A waiting timed stage goes first: untimed work cannot starve it."""

    def __init__(self):
        self._changed = threading.Condition()
        self._untimed = 0
        self._timed = False
        self._timed_waiting = 0
        self._closed = False

    def acquire(self, kind: str) -> float:
        """Seconds waited for `kind` of work (they do not count against a cell's timeout)."""
        started = time.monotonic()
        with self._changed:
            if kind == TIMED:
                self._timed_waiting += 1
                try:
                    self._wait_for(lambda: self._untimed == 0 and not self._timed)
                finally:
                    self._timed_waiting -= 1
                self._timed = True
            else:
                self._wait_for(lambda: not self._timed and not self._timed_waiting)
                self._untimed += 1
        return time.monotonic() - started

    def _wait_for(self, free) -> None:
        self._changed.wait_for(lambda: self._closed or free())
        if self._closed:
            raise GateClosed()

    def release(self, kind: str | None) -> None:
        if kind is None:
            return
        with self._changed:
            if kind == TIMED:
                self._timed = False
            else:
                self._untimed -= 1
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @contextlib.contextmanager
    def untimed(self):
        self.acquire(UNTIMED)
        try:
            yield
        finally:
            self.release(UNTIMED)


class WorkerProcess:
    """One worker process serving the cells of one target in turn (`python -m matrix.run.worker --serve`).

    Isolation stays per target: the process has its own group and memory cap like a one-cell
    worker, and each cell its own timeout. A cell that crashes it, hangs or runs out of memory
    ends that process; the target's next cell starts a fresh one, so a crash costs one cell.
    Each of its stages is granted by the run's StageGate."""

    def __init__(self, memory_limit: int | None, lifetime_s: float, gate: StageGate | None = None):
        self.memory_limit, self.lifetime_s = memory_limit, lifetime_s  # lifetime: the watchdog's limit off Linux
        self.gate = gate or StageGate()  # a worker on its own: every stage is granted at once
        self.process: subprocess.Popen | None = None
        self.env: dict | None = None
        self.messages: queue.Queue = queue.Queue()
        self.holding: str | None = None  # the kind of work the gate granted this worker's current stage

    def serve(self, cell_dir: Path, env: dict, timeout_s: float, on_stage) -> guarded.Ending:
        started = time.perf_counter()
        log = cell_dir / LOG_FILE
        if self.process is None or self.process.poll() is not None or env != self.env:
            self._start_untimed(env, log)
        last_stage = [START]
        try:
            self.process.stdin.write(f"{cell_dir.resolve()}\n")
            self.process.stdin.flush()
        except OSError:  # it died between cells: its exit is read below like any other
            pass
        try:
            ended = self._await_end(timeout_s, last_stage, on_stage)
        except BaseException:  # the run itself is interrupted: no orphaned runtime
            self._kill()
            raise
        finally:
            self._release()
        returncode = 0
        if ended != "done":  # hung or dead: its group goes, the target's next cell starts afresh
            returncode = self._kill()
        return guarded.Ending(returncode, time.perf_counter() - started, ended == "timeout", last_stage[0], timeout_s,
                      self.memory_limit, log)

    def abort(self) -> None:
        """From another thread, when the run is interrupted: the worker's group goes now; the thread
        serving it reads the exit and cleans up."""
        process = self.process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def _kill(self) -> int:
        isolation.kill_group(self.process)
        returncode, self.process = self.process.returncode, None
        return returncode

    def _start_untimed(self, env: dict, log: Path) -> None:
        """A worker's start (its fork, the imports of its entry module) is untimed work like its stages: it waits
        while another target's latency or cold start is timed instead of running beside it, and holds no
        process meanwhile. The grant is held until the worker asks for its first stage."""
        self._hold(UNTIMED)
        try:
            self._start(env, log)
        except BaseException:
            self._release()
            raise

    def _start(self, env: dict, log: Path) -> None:
        self.stop()
        self.env, self.messages = env, queue.Queue()
        with open(log, "w") as first_log:  # until the worker sends its stderr to each cell's own log
            self.process = isolation.start([sys.executable, "-m", "matrix.run.worker", "--serve"],
                                           memory_limit=self.memory_limit, timeout_s=self.lifetime_s,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=first_log, text=True, env=env)
        threading.Thread(target=_relay, args=(self.process, self.messages), daemon=True).start()

    def _await_end(self, timeout_s: float, last_stage: list, on_stage) -> str:
        """"done" when the cell finished, "exited" when the worker died, "timeout" on the cell's timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return "timeout"
            if message is None:
                return "exited"
            if "done" in message:
                return "done"
            if "gate" in message:
                deadline += self._grant(message["gate"])
            guarded.note_stage(message, last_stage, on_stage)

    def _grant(self, kind: str) -> float:
        """Let the worker go on with `kind` of work once the gate allows it; the seconds it waited."""
        waited = self._hold(TIMED if kind == TIMED else UNTIMED)
        with contextlib.suppress(OSError):  # a worker that died meanwhile: its exit is read next
            self.process.stdin.write(f"{GO}\n")
            self.process.stdin.flush()
        return waited

    def _hold(self, kind: str) -> float:
        """The gate's grant for `kind` instead of the one held; the seconds it waited."""
        self._release()
        waited = self.gate.acquire(kind)
        self.holding = kind
        return waited

    def _release(self) -> None:
        self.gate.release(self.holding)
        self.holding = None

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # end of input: a healthy worker exits on its own
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            isolation.kill_group(self.process)  # and nothing it started outlives it
            self.process = None


def _relay(process, messages: queue.Queue) -> None:
    for message in guarded.protocol_messages(process.stdout):
        messages.put(message)
    messages.put(None)  # end of output: the worker exited


# The tool's own files failing (a full disk, a read-only or failing mount): the tool's problem, not the runtime's.
TOOL_IO_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
TOOL_IO_PREFIX = "the tool could not write its files"


def name_tool_io(message: str, folder: Path | None = None) -> str:
    """A failure whose words carry a disk errno, or that ended while `folder` cannot take a write (a worker
    on a full disk cannot even log why it stopped), said as what it is, naming the errno; a resumed run
    re-runs such cells (orchestrate.Journal.finished)."""
    found = next((number for number in TOOL_IO_ERRNOS if os.strerror(number) in message), None)
    if found is None and folder is not None:
        found = _write_fails(folder)
    if found is None or message.startswith(TOOL_IO_PREFIX):
        return message
    return f"{TOOL_IO_PREFIX} ({errno.errorcode[found]}: {os.strerror(found)}): {message}"


def _write_fails(folder: Path) -> int | None:
    """The disk errno of writing one page into `folder` now, or None when it takes it."""
    probe = folder / ".write-probe"
    try:
        probe.write_bytes(bytes(4096))
    except OSError as error:
        return error.errno if error.errno in TOOL_IO_ERRNOS else None
    finally:
        probe.unlink(missing_ok=True)
    return None


def failed_on_tool_io(cell: Cell) -> bool:
    return cell.error is not None and cell.error.message.startswith(TOOL_IO_PREFIX)


def _measurement(cell_dir: Path, ending: guarded.Ending) -> Measurement:
    """What the worker left (possibly partial: it writes as it goes), plus why it stopped when it
    did not finish on its own."""
    measurement = Measurement.read(cell_dir)
    if measurement is None:
        measurement = Measurement()
    elif measurement.error:
        measurement.error.message = guarded.name_out_of_memory(measurement.error.message, ending.memory_limit)
        measurement.error.message = name_tool_io(measurement.error.message)
    if measurement.stopped_itself or (ending.returncode == 0 and not ending.timed_out and measurement.stage != START):
        return measurement
    stage = measurement.stage if measurement.stage not in (START, DONE) else ending.last_stage
    return measurement.model_copy(update={"error": CellError(stage=stage, message=name_tool_io(ending.describe(), cell_dir))})


def _arrays(cell_dir: Path) -> Feeds:
    path = cell_dir / OUTPUTS_FILE
    if not path.exists():
        return {}
    try:
        return observations.read(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # cut short by a kill or a full disk
        return {}


def skipped(*, host: str, target: str, variant: str, reason: str, runtime_version: str = "") -> Cell:
    return Cell(host=host, target=target, variant=variant, verdict="SKIP", reasons=[reason], runtime_version=runtime_version)
