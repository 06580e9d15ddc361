"""The one protocol of every process that touches the user's model: cells, the reference, the tool's own steps.

A guarded process gets a spec in (a JSON file in its folder), reports the stages it enters (one
JSON line each on stdout, matrix.run.stage_lines.stage_message), leaves its result in the folder (written
whole, then swapped in), writes its stderr to a log there, and runs under the run's limits
(matrix.run.isolation: --timeout, the memory cap, its own process group, death with the runner). When
it gives no result, `Ending` says why it ended (timeout, out of memory, a signal, an exit code with
its last log line). A hostile model ends that process, never the runner.

Two kinds of job speak it:
- the cell worker (`python -m matrix.run.worker`, matrix.run.cells): spec.json in, measurement.json and
  outputs.npz out, rewritten after every stage so a late crash keeps what was measured;
- the tool's steps, `python -m matrix.run.guarded STEP FOLDER`: FOLDER/job_spec.json in, the step's
  answer (plain JSON) in FOLDER/job_result.json, arrays as .npz files beside it, never pickles.
  Outside the cells the tool evaluates the user's graph too: the float64 reference, checking a
  variant (ORT folds constants while it loads), onnxsim verifying its folding, a diagnosis
  evaluating every intermediate, an environment check.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from targets.base import signal_name
from targets.out_of_memory import looks_out_of_memory

from . import isolation
from ..options import memory_text
from ..outdir import write_atomic
from .stage_lines import START, read_message, stage_message

# step -> "module:function(spec: dict, folder: Path) -> dict"; imported in the child only
STEPS = {
    "reference": "matrix.reference.reference_job:guarded_step",
    "variant": "matrix.run.variants:guarded_step",
    "preparations": "matrix.assist.preparations:guarded_step",
    "intermediates": "matrix.assist.diagnose:guarded_step",
    "env-check": "matrix.run.env_check:guarded_step",
}
SPEC_FILE = "job_spec.json"
RESULT_FILE = "job_result.json"
LOG_FILE = "job.log"


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    memory_limit: int | None


class StepFailed(RuntimeError):
    """The step's process ended without an answer; the message says how (timeout, memory, its error)."""


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
        if self.memory_limit and looks_out_of_memory(tail):
            return f"out of memory (limit {memory_text(self.memory_limit)}): {tail}"
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


def run_process(command: list[str], log_path: Path, env: dict, limits: Limits, on_stage,
                on_started=lambda: None) -> Ending:
    """Run `command` isolated (own group, memory cap, dies with the runner), follow its stage
    lines, and kill its whole group on a timeout or when the run itself is interrupted. `on_started` is called once
    the process runs: what the caller does then overlaps it (the caller's thread waits for the process meanwhile)."""
    with open(log_path, "w") as log:
        process = isolation.start(command, memory_limit=limits.memory_limit, timeout_s=limits.timeout_s,
                                  stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        on_started()
        return follow(process, log_path, limits, on_stage)


def follow(process, log_path: Path, limits: Limits, on_stage) -> Ending:
    """Follow a started guarded process's stage lines until it ends; its --timeout counts from now (a process
    started earlier and left waiting for its input is timed on its work). Its whole group is killed at the end."""
    started = time.perf_counter()
    last_stage = [START]
    timed_out = False
    reader = threading.Thread(target=_follow, args=(process, last_stage, on_stage), daemon=True)
    reader.start()
    try:
        process.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # on a timeout, and when the run itself is interrupted: no orphaned runtime
        isolation.kill_group(process)
    reader.join(timeout=5)
    return Ending(process.returncode, time.perf_counter() - started, timed_out, last_stage[0], limits.timeout_s,
                  limits.memory_limit, log_path)


def attempt(step: str, spec: dict, folder: Path, limits: Limits, on_stage=lambda stage: None,
            on_started=lambda: None) -> tuple[dict | None, Ending]:
    """The step's answer (None when it gave none) and how its process ended (`on_started`: see run_process)."""
    folder.mkdir(parents=True, exist_ok=True)
    answer = folder / RESULT_FILE
    answer.unlink(missing_ok=True)
    write_atomic(folder / SPEC_FILE, json.dumps(spec))
    ending = run_process([sys.executable, "-m", "matrix.run.guarded", step, str(folder)], folder / LOG_FILE,
                         dict(os.environ), limits, on_stage, on_started)
    try:
        return json.loads(answer.read_text()), ending
    except (OSError, ValueError):
        return None, ending


def run(step: str, spec: dict, folder: Path, limits: Limits) -> dict:
    """The step's answer; StepFailed saying how its process ended when it gave none."""
    answer, ending = attempt(step, spec, folder, limits)
    if answer is None:
        raise StepFailed(ending.describe())
    return answer


def stage(name: str, progress: str = "") -> None:
    """In a guarded process: the line that says it entered a stage."""
    print(stage_message(name, progress), flush=True)


def protocol_messages(stream):
    """The protocol's JSON lines on a process's stdout; a runtime printing there is not a message."""
    for line in stream:
        message = read_message(line)
        if message is not None:
            yield message


def note_stage(message: dict, last_stage: list, on_stage) -> None:
    name = message.get("stage")
    if name:
        last_stage[0] = name
        on_stage(f"{name} ({message['progress']})" if "progress" in message else name)


def _follow(process, last_stage: list, on_stage) -> None:
    for message in protocol_messages(process.stdout):
        note_stage(message, last_stage, on_stage)


def name_out_of_memory(message: str, memory_limit: int | None) -> str:
    """A runtime's allocation failure under the cap, said as what it is."""
    if memory_limit and looks_out_of_memory(message):
        return f"out of memory (limit {memory_text(memory_limit)}): {message}"
    return message


def read_json(path: Path) -> dict:
    """{} when absent or cut short (a process killed while writing)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _main(step: str, folder: Path) -> None:
    module, function = STEPS[step].split(":")
    answer = getattr(importlib.import_module(module), function)(json.loads((folder / SPEC_FILE).read_text()), folder)
    write_atomic(folder / RESULT_FILE, json.dumps(answer))


if __name__ == "__main__":
    _main(sys.argv[1], Path(sys.argv[2]))
