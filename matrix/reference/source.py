"""`--source`: the policy as its training framework runs it, one more column of the matrix.

The step before any runtime is the export itself: a graph that ends in tanh while SB3's
`predict` rescales to the action space, a normaliser left outside the graph, a clip the
simulator applied. The source column runs the policy in the user's own training interpreter
(`--source-python`: matrix/reference/source_runner.py there, matrix/reference/source_job.py guarding it here),
compares it with the ONNX graph's float64 reference on the same observations (export
parity), names a contract difference by fitting a few transforms (matrix/reference/source_fit.py),
drives the run's seeded episodes and times `predict` per call at batch 1.

The column's process is started while the options are checked (`preflight`): its training interpreter
imports the framework and the user's module (a missing package is one line and exit 2 before anything
runs), then waits, idle on its stdin, until the run reaches the column (`execute`). Importing SB3 and
torch costs 2.5-7 CPU s (idle to busy machine); one process for both imports them once per run, not
twice. It is under the memory cap from its start, its --timeout counts the column's work from the
column's start, and it ends with the column, or with the run when the run ends without it.

A source is the user's own code and checkpoint: loading it executes code, as training did,
unlike every other input of a run, which is never unpickled or executed.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..run import cells, guarded, isolation, rollouts
from ..inputs import contract
from ..inputs.batch_axes import batched, without_batch
from ..judge import rules
from .. import userfiles
from ..errors import InputError
from ..inputs.model import ModelInfo
from ..run.protocol import STAGES_AFTER_PARITY
from .reference import Reference
from ..results import Cell
from .source_fit import DIVIDE_255, NORMALIZE, Bounds, Explanation, explain
from . import SOURCE_TARGET, source_runner
from .source_job import FACTS_FILE
from ..judge.judge import Evidence, Judge, parity

FORMS = {"sb3": "PATH.zip", "torch": "MODULE:ATTR", "torchscript": "PATH.pt", "python": "MODULE:FUNC"}
FILE_KINDS = ("sb3", "torchscript")
LATENCY_NOTE = ("latency: the training framework's Python path (the source called per observation at batch 1 in "
                "--source-python), beside the runtimes, not a deployment runtime")


@dataclass(frozen=True)
class SourceSpec:
    kind: str
    target: str  # an absolute file path (sb3, torchscript) or MODULE:ATTR
    python: str  # the training interpreter
    normalize: str = ""  # observation statistics (VecNormalize pickle or .npz), absolute
    column: ColumnProcess | None = field(default=None, compare=False, repr=False)  # checked by preflight, waiting

    @property
    def user_module(self) -> str | None:
        """The top-level package of a MODULE:ATTR source (the user's own code), None for a file."""
        return None if self.kind in FILE_KINDS else self.target.split(":")[0].split(".")[0]

    def runner_spec(self) -> dict:
        return {"kind": self.kind, "target": self.target, "normalize": self.normalize}

    def describe(self) -> dict:
        """The run's options entry (file names only: a path says nothing to a reader of another host)."""
        shown = Path(self.target).name if self.kind in FILE_KINDS else self.target
        return {"source": f"{self.kind}:{shown}", "python": self.python,
                "normalize": Path(self.normalize).name if self.normalize else ""}


def parse(text: str, python: str | None, normalize: Path | None) -> SourceSpec:
    """--source KIND:..., --source-python and --source-normalize, checked without running anything."""
    kind, sep, rest = text.partition(":")
    forms = ", ".join(f"{k}:{v}" for k, v in FORMS.items())
    if not sep or kind not in FORMS or not rest:
        raise InputError(f"--source {text!r}: expected one of {forms}")
    if kind in FILE_KINDS:
        userfiles.check_regular(Path(rest), "--source checkpoint")  # read as every file of the user's: a FIFO is refused, not waited on
        rest = str(Path(rest).resolve())
    else:
        module, _, attribute = rest.partition(":")
        if not attribute.isidentifier() or not all(part.isidentifier() for part in module.split(".")):
            raise InputError(f"--source {text!r}: expected {kind}:{FORMS[kind]}, e.g. {kind}:my_package.policy:make_policy")
    if normalize is not None:
        userfiles.check_regular(normalize, "--source-normalize statistics")
    return SourceSpec(kind, rest, _interpreter(python), str(normalize.resolve()) if normalize else "")


def _interpreter(python: str | None) -> str:
    if not python:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if found is None:
        raise InputError(f"--source-python {python}: no such executable")
    return str(Path(found).absolute())


def check_model(model: ModelInfo) -> None:
    """Every input is an observation's (one, or one per Dict key): the column does not carry a recurrent state."""
    if model.state_pairs:
        states = [pair.input for pair in model.state_pairs]
        raise InputError(f"--source does not feed a recurrent policy's state; {model.path.name} carries {states} (the "
                         "source column calls the policy one observation at a time; --env drives the runtimes without it)")


def check_normalizer(spec: SourceSpec, model: ModelInfo, memory_limit: int | None) -> None:
    """An .npz normaliser's statistics are for the model's observation inputs, read from its array names as the
    training interpreter reads them (source_runner.npz_statistics), bounded as every user file is, never a pickle: a
    mismatch is one line before anything runs. A VecNormalize pickle is the user's code, unpickled in the training
    interpreter only; its keys are checked there, in the source cell."""
    path = Path(spec.normalize)
    if path.suffix != ".npz":
        return
    what = "--source-normalize statistics"
    observed = {i.name: i for i in batched(model)}
    try:
        found = source_runner.npz_statistics(userfiles.npz_names(path, what, memory_limit))
        for_inputs = source_runner.statistics_inputs(found, list(observed))
    except ValueError as error:
        raise InputError(f"{error} ({path.name})") from None
    arrays = userfiles.read_arrays(path, what, memory_limit, [name for pair in found.values() for name in pair])
    for key, (mean, var) in found.items():
        row = without_batch(observed[for_inputs[key]], model.batch_axes)
        for name in (mean, var):
            _check_statistic(name, arrays[name], row, path)
        if (arrays[var] < 0).any():
            raise InputError(f"{path.name}: '{var}' holds a negative variance: no statistics a normaliser keeps")


def _check_statistic(name: str, values: np.ndarray, row: list, path: Path) -> None:
    """Finite numbers of a shape that broadcasts to one observation of its input (VecNormalize keeps the
    observation's shape): a NaN or the wrong shape had been the source cell's NaN answers or FAIL on numpy's words."""
    if values.dtype.kind not in "biuf" or not np.isfinite(values).all():
        raise InputError(f"{path.name}: '{name}' holds a value that is not a finite number")
    if all(isinstance(d, int) for d in row):
        try:
            fits = list(np.broadcast_shapes(values.shape, tuple(row))) == row
        except ValueError:
            fits = False
        if not fits:
            raise InputError(f"{path.name}: '{name}' has shape {list(values.shape)}, one observation of its input "
                             f"has {row}")


def preflight(spec: SourceSpec, memory_limit: int | None, timeout_s: float) -> SourceSpec:
    """Exit 2 with one line when the training interpreter cannot run this source at all: it does not
    start, has no numpy, or lacks the framework or a package the user's module imports. The spec comes
    back holding the checked column process, which waits for the column. The checkpoint is loaded once,
    in the guarded source cell; a check that hangs is left to that cell's --timeout, in a process of its own."""
    column = ColumnProcess(spec, memory_limit)
    check = column.check_answer(timeout_s)
    if check is None:  # a module that hangs on import: the source cell says so, as a FAIL
        column.close()
        return spec
    try:
        _judge_check(spec, check)
    except InputError:
        column.close()
        raise
    return replace(spec, column=column)


def _judge_check(spec: SourceSpec, check: dict) -> None:
    where = f"--source {spec.describe()['source']}"
    if "start_error" in check:
        raise InputError(f"--source-python {spec.python}: cannot start it ({check['start_error']})")
    answer = check["answer"]
    if answer is None:
        tail = next((line.strip() for line in reversed(check["stderr"].splitlines()) if line.strip()), "no output")
        if "No module named 'numpy'" in tail:
            raise InputError(f"--source-python {spec.python}: lacks the package 'numpy' (the source runner needs it there)")
        raise InputError(f"--source-python {spec.python}: cannot run the source runner: {tail[:300]}")
    if not answer["ok"]:
        raise InputError(f"{where}: {answer['error']}")
    missing = answer["result"].get("missing")
    if missing and missing == spec.user_module:
        raise InputError(f"{where}: {spec.python} cannot find the module {missing!r} "
                         f"(run from the folder that holds it, or install it in the training environment)")
    if missing:
        raise InputError(f"{where}: {spec.python} lacks the package {missing!r} "
                         "(install it in the training environment, or pass that environment's --source-python)")


class ColumnProcess:
    """The source column's guarded process (matrix.reference.source_job), started with the memory cap, in its own
    process group and dying with the runner (matrix.run.isolation). It checks the source first, then waits for
    the column's folder on its stdin; closing it (or the run ending without a column) ends its group."""

    def __init__(self, spec: SourceSpec, memory_limit: int | None, check: bool = True):
        # Its stderr, the cell's log, lands in the column's folder, which does not exist yet: an unnamed file until then.
        self.log = tempfile.TemporaryFile(prefix="policy-matrix-source-", suffix=".log")  # noqa: SIM115
        # timeout_s=inf: a watchdog (hosts without a parent-death signal) must not end it while it waits for the
        # column; the column's --timeout is counted from the column's start (guarded.follow).
        self.process = isolation.start([sys.executable, "-m", "matrix.reference.source_job"], memory_limit=memory_limit,
                                       timeout_s=float("inf"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=self.log, text=True, env=dict(os.environ))
        self._ended = weakref.finalize(self, _end, self.process, self.log)  # a run that never reaches its column
        self._send({"python": spec.python, "source": spec.runner_spec(), "check": check})

    def _send(self, request: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # it ended already: how is read from its exit and log
            pass

    def check_answer(self, timeout_s: float) -> dict | None:
        """The check's answer (source_job.check), or what the job's log says when it ended without one; None when
        none came within timeout_s."""
        answers: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: answers.put(_check_message(self.process.stdout)), daemon=True).start()
        try:
            check = answers.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return check if check is not None else {"answer": None, "stderr": self.log_text()}

    def run(self, folder: Path, limits: guarded.Limits, on_stage) -> guarded.Ending:
        """The column, under `limits` from now; its log is left in the folder."""
        log = folder / "source.log"
        self._send({"folder": str(folder.resolve())})
        try:
            return guarded.follow(self.process, log, limits, on_stage)
        finally:
            log.write_text(self.log_text())
            self.close()

    def log_text(self) -> str:
        descriptor = self.log.fileno()  # read at an offset: the job's writes go on where they were
        return os.pread(descriptor, os.fstat(descriptor).st_size, 0).decode(errors="replace")

    def close(self) -> None:
        self._ended()


def _check_message(stdout) -> dict | None:
    for message in guarded.protocol_messages(stdout):
        if "check" in message:
            return message["check"]
    return None


def _end(process, log) -> None:
    isolation.kill_group(process)
    log.close()


# --- running the column ----------------------------------------------------------------------

@dataclass
class ColumnInputs:
    """What the source cell shares with the run: its observations, reference and limits."""

    model: ModelInfo
    observations: Path
    chunk: int
    warmup: int
    iters: int
    timeout_s: float
    memory_limit: int | None
    rollout: rollouts.RolloutPlan | None
    side_inputs: dict[str, np.ndarray]  # the values given to inputs fed whole (--side-input, a --trajectory's)


def execute(spec: SourceSpec, inputs: ColumnInputs, folder: Path, on_stage) -> cells.CellOutcome:
    """The source job under the cell's --timeout and memory cap; what it left, as a cell's outcome."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("measurement.json", "outputs.npz", FACTS_FILE):
        (folder / stale).unlink(missing_ok=True)
    job_spec = {
        "model": str(inputs.model.path.resolve()),
        "observations": str(inputs.observations.resolve()), "chunk": inputs.chunk,
        "obs_inputs": [spec.name for spec in inputs.model.inputs], "outputs": [o.name for o in inputs.model.outputs],
        "batch_axes": {spec.name: inputs.model.batch_axes[spec.name] for spec in batched(inputs.model)},
        "action_output": inputs.rollout.action_output if inputs.rollout else contract.action_output(inputs.model),
        "rollout": inputs.rollout.as_dict() if inputs.rollout else None, "warmup": inputs.warmup, "iters": inputs.iters,
        "side_inputs": {name: value.tolist() for name, value in inputs.side_inputs.items()},
    }
    (folder / "source_spec.json").write_text(json.dumps(job_spec))
    # Without a checked process (its check hung), the column goes straight to loading, where its --timeout finds the hang.
    column = spec.column if spec.column is not None else ColumnProcess(spec, inputs.memory_limit, check=False)
    ending = column.run(folder, guarded.Limits(inputs.timeout_s, inputs.memory_limit), on_stage)
    return cells.CellOutcome(cells._measurement(folder, ending), cells._arrays(folder), ending.duration_s)


@dataclass
class Judging:
    """The run's one Judge and what every cell is compared with: the source is judged like any cell."""

    host: str
    judge: Judge
    evidence: Evidence


def judge(spec: SourceSpec, outcome: cells.CellOutcome, facts: dict, judging: Judging) -> Cell:
    """Export parity by the rules of any cell (behaviour decides with --env), the contract
    difference named when a transform explains it, the source's latency labelled as such."""
    m, evidence = outcome.measurement, judging.evidence
    context = replace(judging.judge.context(SOURCE_TARGET, spec.kind), returns_both_ways=True)
    cell = Cell(host=judging.host, target=SOURCE_TARGET, variant=spec.kind, verdict="SKIP", runtime_version=m.runtime_version,
                latency=m.latency, error=m.error, tolerance=context.tolerance.atol, rtol=context.tolerance.rtol,
                duration_s=outcome.duration_s, notes=[LATENCY_NOTE] if m.latency else [])
    if m.skip is not None:  # the column cannot compare this export (source_job: an input the policy does not take)
        cell.reasons = [m.skip]
        return cell
    outputs = shaped_outputs(outcome.arrays, evidence.reference.outputs)
    if outputs and (m.error is None or m.error.stage in STAGES_AFTER_PARITY):
        cell.parity = parity(outputs, evidence, context)
        cell.rollout = rollouts.summarise(m.rollout, outcome.arrays, evidence.reference_rollout, evidence.rollout_plan)
        cell.notes.append(f"compared outputs: {', '.join(p.output for p in cell.parity)} (what the source returns)")
    elif m.error is None:  # the tool could not pair the answers with the graph's outputs: not the export's verdict
        cell.reasons = [unpaired_reason(outcome.arrays, evidence.reference.outputs)]
        return cell
    cell.verdict, cell.reasons = rules.verdict(cell, context)
    explanation = name_difference(outputs, outcome.arrays, facts, evidence, context.tolerance.atol)
    if explanation is not None:
        cell.reasons.insert(0, f"export: {explanation.text} (left after it: {explanation.residual:.2g})")
    return cell


def shaped_outputs(arrays: dict, reference: dict) -> dict:
    """The source's answers (one flat row per observation) in the reference's shape, where they fit."""
    shaped = {}
    for name, expected in reference.items():
        answer = arrays.get(f"outputs/{name}")
        if answer is not None and answer.size == expected.size:
            shaped[f"outputs/{name}"] = answer.reshape(expected.shape)
    return shaped


def unpaired_reason(arrays: dict, reference: dict) -> str:
    given = ", ".join(f"{k.removeprefix('outputs/')} {list(v.shape[1:])}" for k, v in arrays.items() if k.startswith("outputs/"))
    expected = ", ".join(f"{name} {list(value.shape[1:])}" for name, value in reference.items())
    return (f"the source's answers per observation ({given or 'none'}) fit none of the ONNX outputs ({expected}): "
            "export parity cannot be measured")


def name_difference(outputs: dict, arrays: dict, facts: dict, evidence: Evidence, tolerance: float) -> Explanation | None:
    """For the continuous action: which transform makes the reference equal the source."""
    bounds = action_bounds(facts, evidence.rollout_plan)
    for name, expected in evidence.reference.outputs.items():
        answer = outputs.get(f"outputs/{name}")
        if answer is None or answer.dtype.kind != "f" or expected.dtype.kind != "f":
            continue
        transformed = {t: values.reshape(expected.shape) for t, values in _transformed(arrays, name).items()
                       if values.size == expected.size}
        found = explain(answer, expected, tolerance, bounds, transformed)
        if found is not None:
            return found
    return None


def _transformed(arrays: dict, output: str) -> dict[str, np.ndarray]:
    """The reference's `output` on each transform of the observations (source_job: transform/TRANSFORM/OUTPUT)."""
    suffix = f"/{output}"
    found = {key.removeprefix("transform/").removesuffix(suffix): values for key, values in arrays.items()
             if key.startswith("transform/") and key.endswith(suffix)}
    return {t: values for t, values in found.items() if t in (NORMALIZE, DIVIDE_255) or t.startswith(f"{DIVIDE_255}:")}


def action_bounds(facts: dict, plan: rollouts.RolloutPlan | None) -> Bounds | None:
    """The action space's finite bounds: the environment's (--env), else what the source said (SB3's saved space)."""
    space = None
    if plan is not None and not plan.open_loop:
        env = rollouts.make_env(plan.env, plan.env_kwargs)
        try:
            space = getattr(env.action_space, "low", None), getattr(env.action_space, "high", None)
        finally:
            env.close()
    elif facts.get("action_space"):
        space = facts["action_space"]["low"], facts["action_space"]["high"]
    if space is None or space[0] is None:
        return None
    try:  # what the source's interpreter said about its space: numbers, or no bounds to name a difference with
        low, high = np.asarray(space[0], np.float64), np.asarray(space[1], np.float64)
    except (TypeError, ValueError):
        return None
    return Bounds(low.reshape(-1), high.reshape(-1)) if np.isfinite(low).all() and np.isfinite(high).all() else None


def read_facts(folder: Path) -> dict:
    return guarded.read_json(folder / FACTS_FILE)


def run_column(spec: SourceSpec, inputs: ColumnInputs, judging: Judging, folder: Path, on_stage) -> Cell:
    outcome = execute(spec, inputs, folder, on_stage)
    return judge(spec, outcome, read_facts(folder), judging)

