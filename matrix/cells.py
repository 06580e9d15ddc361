"""Run one cell in a worker process with a timeout, then judge what it measured.

The worker leaves plain files (matrix/protocol.py: spec in, `Measurement` and
outputs out); this side validates them and turns them into a `Cell`: parity
against the reference, the contract, the verdict. A worker that crashes, hangs
or runs out of memory becomes that cell's FAIL row with what is known.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from targets.base import signal_name

from . import contract, isolation, metrics, rollouts
from .model import ModelInfo
from .observations import Feeds
from .protocol import (DONE, LOG_FILE, MEASUREMENT_FILE, OUTPUTS_FILE, START, STAGES_AFTER_PARITY, CellSpec, Measurement,
                       read_message)
from .reference import Reference
from .results import Cell, CellError
from .verdict import DEFAULT_MIN_AGREEMENT, DEFAULT_TIE_MARGIN, decide


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
    worker: Worker | None = None,
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
        command = [sys.executable, "-m", "matrix.worker", str(cell_dir)]
        ending = run_guarded(command, cell_dir / LOG_FILE, {**os.environ, **env}, timeout_s, memory_limit, on_stage)
    return CellOutcome(_measurement(cell_dir, ending), _arrays(cell_dir), ending.duration_s)


def _prepare_cell_dir(cell_dir: Path, spec: CellSpec) -> None:
    cell_dir.mkdir(parents=True, exist_ok=True)
    for stale in (MEASUREMENT_FILE, OUTPUTS_FILE):
        (cell_dir / stale).unlink(missing_ok=True)
    spec.write(cell_dir)


@dataclass
class Ending:
    """How a guarded process ended, in the words a cell reports."""

    returncode: int
    duration_s: float
    timed_out: bool
    last_stage: str
    timeout_s: float
    memory_limit: int | None
    log: Path

    def describe(self) -> str:
        if self.timed_out:
            return f"timed out after {self.timeout_s:g} s (--timeout)"
        tail = self._log_tail()
        if self.memory_limit and _looks_out_of_memory(tail):
            return f"out of memory (limit {_size(self.memory_limit)}): {tail}"
        if self.returncode < 0:
            number = -self.returncode
            return f"killed by signal {number} ({signal_name(number)}) after {self.duration_s:.1f} s" + (f": {tail}" if tail else "")
        return f"exited with code {self.returncode}" + (f": {tail}" if tail else "")

    def _log_tail(self) -> str:
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return lines[-1].strip()[:600] if lines else ""


def run_guarded(command, log_path: Path, env: dict, timeout_s: float, memory_limit: int | None, on_stage) -> Ending:
    """Run `command` isolated (own group, memory cap, dies with the runner), follow its stage
    lines, and kill its whole group on a timeout or when the run itself is interrupted."""
    started = time.perf_counter()
    last_stage = [START]
    timed_out = False
    with open(log_path, "w") as log:
        process = isolation.start(command, memory_limit=memory_limit, timeout_s=timeout_s,
                                  stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        reader = threading.Thread(target=_follow, args=(process, last_stage, on_stage), daemon=True)
        reader.start()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # on a timeout, and when the run itself is interrupted: no orphaned runtime
            isolation.kill_group(process)
        reader.join(timeout=5)
    return Ending(process.returncode, time.perf_counter() - started, timed_out, last_stage[0], timeout_s, memory_limit, log_path)


class Worker:
    """One worker process serving the cells of one target in turn (`python -m matrix.worker --serve`).

    Isolation stays per target: the process has its own group and memory cap like a one-cell
    worker, and each cell its own timeout. A cell that crashes it, hangs or runs out of memory
    ends that process; the target's next cell starts a fresh one, so a crash costs one cell."""

    def __init__(self, memory_limit: int | None, lifetime_s: float):
        self.memory_limit, self.lifetime_s = memory_limit, lifetime_s  # lifetime: the watchdog's limit off Linux
        self.process: subprocess.Popen | None = None
        self.env: dict | None = None
        self.messages: queue.Queue = queue.Queue()

    def serve(self, cell_dir: Path, env: dict, timeout_s: float, on_stage) -> Ending:
        started = time.perf_counter()
        log = cell_dir / LOG_FILE
        if self.process is None or self.process.poll() is not None or env != self.env:
            self._start(env, log)
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
        returncode = 0
        if ended != "done":  # hung or dead: its group goes, the target's next cell starts afresh
            returncode = self._kill()
        return Ending(returncode, time.perf_counter() - started, ended == "timeout", last_stage[0], timeout_s,
                      self.memory_limit, log)

    def _kill(self) -> int:
        isolation.kill_group(self.process)
        returncode, self.process = self.process.returncode, None
        return returncode

    def _start(self, env: dict, log: Path) -> None:
        self.stop()
        self.env, self.messages = env, queue.Queue()
        with open(log, "w") as first_log:  # until the worker sends its stderr to each cell's own log
            self.process = isolation.start([sys.executable, "-m", "matrix.worker", "--serve"],
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
            _on_message(message, last_stage, on_stage)

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # end of input: a healthy worker exits on its own
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            isolation.kill_group(self.process)  # and nothing it started outlives it
            self.process = None


def _messages(stream):
    """The protocol's JSON lines on a worker's stdout; a runtime printing there is not a message."""
    for line in stream:
        message = read_message(line)
        if message is not None:
            yield message


def _relay(process: subprocess.Popen, messages: queue.Queue) -> None:
    for message in _messages(process.stdout):
        messages.put(message)
    messages.put(None)  # end of output: the worker exited


def _on_message(message: dict, last_stage: list, on_stage) -> None:
    name = message.get("stage")
    if name:
        last_stage[0] = name
        on_stage(f"{name} ({message['progress']})" if "progress" in message else name)


def _follow(process: subprocess.Popen, last_stage: list, on_stage) -> None:
    for message in _messages(process.stdout):
        _on_message(message, last_stage, on_stage)


MEMORY_WORDS = ("MemoryError", "bad_alloc", "Unable to allocate", "Failed to allocate", "Cannot allocate memory",
                "out of memory", "std::length_error", "Memory allocation still failed")  # the last: OpenBLAS


def _looks_out_of_memory(text: str) -> bool:
    return any(word in text for word in MEMORY_WORDS)


def name_out_of_memory(message: str, memory_limit: int | None) -> str:
    """A runtime's allocation failure under the cap, said as what it is."""
    if memory_limit and _looks_out_of_memory(message):
        return f"out of memory (limit {_size(memory_limit)}): {message}"
    return message


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


def _measurement(cell_dir: Path, ending: Ending) -> Measurement:
    """What the worker left (possibly partial: it writes as it goes), plus why it stopped when it
    did not finish on its own."""
    measurement = Measurement.read(cell_dir)
    if measurement is None:
        measurement = Measurement()
    elif measurement.error:
        measurement.error.message = name_out_of_memory(measurement.error.message, ending.memory_limit)
        measurement.error.message = name_tool_io(measurement.error.message)
    if measurement.stopped_itself or (ending.returncode == 0 and not ending.timed_out and measurement.stage != START):
        return measurement
    stage = measurement.stage if measurement.stage not in (START, DONE) else ending.last_stage
    return measurement.model_copy(update={"error": CellError(stage=stage, message=name_tool_io(ending.describe(), cell_dir))})


def read_json(path: Path) -> dict:
    """{} when absent or cut short (a worker killed while writing)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):g} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):g} MiB"


def _arrays(cell_dir: Path) -> Feeds:
    path = cell_dir / OUTPUTS_FILE
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # cut short by a kill or a full disk
        return {}


def judge(
    outcome: CellOutcome, *, host: str, target: str, variant: str, predicts: bool, model: ModelInfo,
    reference: Reference, dev_runtime: Feeds | None, tolerance: float,
    tie_margin: float = DEFAULT_TIE_MARGIN, min_agreement: float = DEFAULT_MIN_AGREEMENT,
    reference_rollout: rollouts.ReferenceRollout | None = None, rollout_plan: rollouts.RolloutPlan | None = None,
    return_tolerance: rollouts.ReturnTolerance | None = None, parity_judged: bool = True,
) -> Cell:
    """parity_judged=False: drift and agreement are measured and shown, but the verdict comes from
    everything else (a candidate with rollouts: its return against the reference is the bar)."""
    m = _unfinished(outcome.measurement, outcome.duration_s)
    cell = Cell(
        host=host, target=target, variant=variant, verdict="SKIP", predicts=predicts,
        runtime_version=m.runtime_version, artifact=m.artifact, latency=m.latency, cold_start_ms=m.cold_start_ms,
        placement=m.placement, backend=m.backend, error=m.error,
        tolerance=tolerance, duration_s=outcome.duration_s, notes=m.notes,
    )
    if m.skip is not None:
        cell.reasons = [m.skip]
        return cell
    if predicts and _measured_parity(cell.error, outcome.arrays):
        cell.parity = _parity(outcome.arrays, reference, dev_runtime, tie_margin)
        cell.contract = contract.check(model, outcome.arrays, reference.outputs)
        cell.rollout = rollouts.summarise(m.rollout, outcome.arrays, reference_rollout, rollout_plan)
    cell.verdict, cell.reasons = decide(cell if parity_judged else _parity_shown_only(cell), tolerance, min_agreement)
    cell.verdict, cell.reasons = rollouts.with_behaviour(cell.verdict, cell.reasons, cell.rollout, return_tolerance)
    return cell


def _parity_shown_only(cell: Cell) -> Cell:
    """The cell as the verdict sees it when its parity is shown, not judged: no drift, no flips."""
    shown = [p.model_copy(update={"max_abs": 0.0, "flips": 0}) for p in cell.parity]
    return cell.model_copy(update={"parity": shown})


def _unfinished(measurement: Measurement, duration_s: float) -> Measurement:
    """A worker that left its measurements but never finished (killed, timed out, crashed hard)
    failed in the stage it had entered; what it measured before that is kept."""
    if measurement.stopped_itself or measurement.stage in (START, DONE):
        return measurement
    stage = measurement.stage
    message = f"the worker stopped during {stage} after {duration_s:.1f} s (killed on timeout or out of memory, or crashed)"
    return measurement.model_copy(update={"error": CellError(stage=stage, message=message)})


def _measured_parity(error: CellError | None, arrays: dict) -> bool:
    """Parity and the contract stand when the cell got past its parity run, whatever failed later."""
    return error is None or (error.stage in STAGES_AFTER_PARITY and any(k.startswith("outputs/") for k in arrays))


def _parity(arrays, reference: Reference, dev_runtime, tie_margin: float):
    return [
        metrics.parity(
            name, arrays[f"outputs/{name}"], expected,
            _same_shape(dev_runtime.get(name) if dev_runtime else None, expected),
            reference.margins.get(name), tie_margin,
        )
        for name, expected in reference.outputs.items()
        if f"outputs/{name}" in arrays and arrays[f"outputs/{name}"].shape == expected.shape
    ]


def _same_shape(array: np.ndarray | None, expected: np.ndarray) -> np.ndarray | None:
    return array if array is not None and array.shape == expected.shape else None


def skipped(*, host: str, target: str, variant: str, reason: str, runtime_version: str = "") -> Cell:
    return Cell(host=host, target=target, variant=variant, verdict="SKIP", reasons=[reason], runtime_version=runtime_version)
