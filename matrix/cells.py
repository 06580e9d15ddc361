"""Run one cell in a worker process with a timeout, then judge what it measured.

The worker leaves plain files; this side turns them into a `Cell`: parity
against the reference, the contract, the verdict. A worker that crashes, hangs
or runs out of memory becomes that cell's FAIL row with what is known.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import contract, isolation, metrics, rollouts
from .model import ModelInfo
from .paths import cache_dir
from .reference import Reference
from .results import ArtifactInfo, Backend, Cell, CellError, LatencyStats, Placement
from .verdict import DEFAULT_MIN_AGREEMENT, DEFAULT_TIE_MARGIN, decide

STAGES = ("prepare", "open", "contract", "parity", "rollout", "latency", "placement")
STAGES_AFTER_PARITY = ("rollout", "latency", "placement")


@dataclass
class CellSpec:
    """What a worker needs to run one cell, written to its spec.json."""

    target: str
    variant: str
    observations: str  # .npz of the observation set
    onnx_variants: dict[str, str]  # the core's ONNX files per precision
    variant_errors: dict[str, str] = field(default_factory=dict)
    cache_dir: str = field(default_factory=lambda: str(cache_dir()))
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    symbolic_batch: bool = True
    chunk: int = 0  # run the observation set in chunks of a fixed batch (0: all at once)
    warmup: int = 20
    iters: int = 200
    threads: int = 1
    whole_inputs: list[str] = field(default_factory=list)  # inputs fed whole to every call, never sliced
    latency_budget_s: float = 30.0  # per batch size: timing stops here and says how many calls it timed
    rollout: dict | None = None  # rollouts.RolloutPlan as a dict: drive episodes with this cell's session
    settings: dict[str, str] = field(default_factory=dict)  # runtime knobs handed to target.open ({}: defaults)
    candidate: str = ""  # which model's variants these are ("" : the first model)


@dataclass
class CellOutcome:
    measurement: dict
    arrays: dict[str, np.ndarray]
    duration_s: float


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
        return CellOutcome({"error": {"stage": "start", "message": f"cannot write the cell's files: {error}"}}, {}, 0.0)
    if worker is not None:
        ending = worker.serve(cell_dir, {**os.environ, **env}, timeout_s, on_stage)
    else:
        command = [sys.executable, "-m", "matrix.worker", str(cell_dir)]
        ending = run_guarded(command, cell_dir / "worker.log", {**os.environ, **env}, timeout_s, memory_limit, on_stage)
    return CellOutcome(_measurement(cell_dir, ending), _arrays(cell_dir), ending.duration_s)


def _prepare_cell_dir(cell_dir: Path, spec: CellSpec) -> None:
    cell_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("measurement.json", "outputs.npz"):
        (cell_dir / stale).unlink(missing_ok=True)
    (cell_dir / "spec.json").write_text(json.dumps(asdict(spec)))


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
            return f"killed by signal {number} ({_signal_name(number)}) after {self.duration_s:.1f} s" + (f": {tail}" if tail else "")
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
    last_stage = ["start"]
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
        log = cell_dir / "worker.log"
        if self.process is None or self.process.poll() is not None or env != self.env:
            self._start(env, log)
        last_stage = ["start"]
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


def _relay(process: subprocess.Popen, messages: queue.Queue) -> None:
    for line in process.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a runtime printing to stdout is not a protocol message
        if isinstance(message, dict):
            messages.put(message)
    messages.put(None)  # end of output: the worker exited


def _on_message(message: dict, last_stage: list, on_stage) -> None:
    name = message.get("stage")
    if name:
        last_stage[0] = name
        on_stage(f"{name} ({message['progress']})" if "progress" in message else name)


def _follow(process: subprocess.Popen, last_stage: list, on_stage) -> None:
    for line in process.stdout:
        try:
            message = json.loads(line)
            name = message.get("stage")
        except (ValueError, AttributeError):
            continue  # a runtime printing to stdout is not a protocol message
        if name:
            last_stage[0] = name
            on_stage(f"{name} ({message['progress']})" if "progress" in message else name)


MEMORY_WORDS = ("MemoryError", "bad_alloc", "Unable to allocate", "Failed to allocate", "Cannot allocate memory",
                "out of memory", "std::length_error", "Memory allocation still failed")  # the last: OpenBLAS


def _looks_out_of_memory(text: str) -> bool:
    return any(word in text for word in MEMORY_WORDS)


def name_out_of_memory(message: str, memory_limit: int | None) -> str:
    """A runtime's allocation failure under the cap, said as what it is."""
    if memory_limit and _looks_out_of_memory(message):
        return f"out of memory (limit {_size(memory_limit)}): {message}"
    return message


def _measurement(cell_dir: Path, ending: Ending) -> dict:
    """What the worker left (possibly partial: it writes as it goes), plus why it stopped when it
    did not finish on its own."""
    measurement = read_json(cell_dir / "measurement.json")
    error = measurement.get("error")
    if error:
        error["message"] = name_out_of_memory(error.get("message", ""), ending.memory_limit)
    if ending.returncode == 0 and measurement and not ending.timed_out:
        return measurement
    if error or "skip" in measurement:
        return measurement
    stage = measurement.get("stage") if measurement.get("stage") not in (None, "done") else ending.last_stage
    return {**measurement, "error": {"stage": stage, "message": ending.describe()}}


def read_json(path: Path) -> dict:
    """{} when absent or cut short (a worker killed while writing)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):g} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):g} MiB"


def _arrays(cell_dir: Path) -> dict[str, np.ndarray]:
    path = cell_dir / "outputs.npz"
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # cut short by a kill or a full disk
        return {}


def judge(
    outcome: CellOutcome, *, host: str, target: str, variant: str, predicts: bool, model: ModelInfo,
    reference: Reference, baseline: dict[str, np.ndarray] | None, tolerance: float,
    tie_margin: float = DEFAULT_TIE_MARGIN, min_agreement: float = DEFAULT_MIN_AGREEMENT,
    reference_rollout: rollouts.ReferenceRollout | None = None, rollout_plan: rollouts.RolloutPlan | None = None,
    return_tolerance: rollouts.ReturnTolerance | None = None, parity_judged: bool = True,
) -> Cell:
    """parity_judged=False: drift and agreement are measured and shown, but the verdict comes from
    everything else (a candidate with rollouts: its return against the reference is the bar)."""
    m = _unfinished(outcome.measurement, outcome.duration_s)
    cell = Cell(
        host=host, target=target, variant=variant, verdict="SKIP", predicts=predicts,
        runtime_version=m.get("runtime_version", ""),
        artifact=ArtifactInfo(**m["artifact"]) if "artifact" in m else None,
        latency=[LatencyStats(**stats) for stats in m.get("latency", [])],
        cold_start_ms=m.get("cold_start_ms"),
        placement=[Placement(**row) for row in m.get("placement", [])],
        backend=Backend(**m["backend"]) if "backend" in m else None,
        error=CellError(**m["error"]) if "error" in m else None,
        tolerance=tolerance, duration_s=outcome.duration_s, notes=m.get("notes", []),
    )
    if "skip" in m:
        cell.reasons = [m["skip"]]
        return cell
    if predicts and _measured_parity(cell.error, outcome.arrays):
        cell.parity = _parity(outcome.arrays, reference, baseline, tie_margin)
        cell.contract = contract.check(model, outcome.arrays, reference.outputs)
        cell.rollout = rollouts.summarise(m.get("rollout"), outcome.arrays, reference_rollout, rollout_plan)
    cell.verdict, cell.reasons = decide(cell if parity_judged else _parity_shown_only(cell), tolerance, min_agreement)
    cell.verdict, cell.reasons = rollouts.with_behaviour(cell.verdict, cell.reasons, cell.rollout, return_tolerance)
    return cell


def _parity_shown_only(cell: Cell) -> Cell:
    """The cell as the verdict sees it when its parity is shown, not judged: no drift, no flips."""
    shown = [p.model_copy(update={"max_abs": 0.0, "flips": 0}) for p in cell.parity]
    return cell.model_copy(update={"parity": shown})


def _unfinished(measurement: dict, duration_s: float) -> dict:
    """A worker that left its measurements but never finished (killed, timed out, crashed hard)
    failed in the stage it had entered; what it measured before that is kept."""
    if any(key in measurement for key in ("error", "skip")) or measurement.get("stage", "done") == "done":
        return measurement
    stage = measurement["stage"]
    message = f"the worker stopped during {stage} after {duration_s:.1f} s (killed on timeout or out of memory, or crashed)"
    return {**measurement, "error": {"stage": stage, "message": message}}


def _measured_parity(error: CellError | None, arrays: dict) -> bool:
    """Parity and the contract stand when the cell got past its parity run, whatever failed later."""
    return error is None or (error.stage in STAGES_AFTER_PARITY and any(k.startswith("outputs/") for k in arrays))


def _parity(arrays, reference: Reference, baseline, tie_margin: float):
    return [
        metrics.parity(
            name, arrays[f"outputs/{name}"], expected,
            _same_shape(baseline.get(name) if baseline else None, expected),
            reference.margins.get(name), tie_margin,
        )
        for name, expected in reference.outputs.items()
        if f"outputs/{name}" in arrays and arrays[f"outputs/{name}"].shape == expected.shape
    ]


def _same_shape(array: np.ndarray | None, expected: np.ndarray) -> np.ndarray | None:
    return array if array is not None and array.shape == expected.shape else None


def skipped(*, host: str, target: str, variant: str, reason: str, runtime_version: str = "") -> Cell:
    return Cell(host=host, target=target, variant=variant, verdict="SKIP", reasons=[reason], runtime_version=runtime_version)
