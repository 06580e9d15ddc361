"""The cell protocol: what the core hands a worker and what the worker hands back.

One module for both sides of the seam: the spec (spec.json), the stages a
worker reports (one JSON line each on stdout), the files of a cell folder, and
the `Measurement` the worker writes (measurement.json) and the judge validates.
The worker only measures; verdicts are the core's (the run's Judge, matrix/judge/judge.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
from pydantic import Field, ValidationError

from .. import options
from ..configuration import Configuration
from ..outdir import write_atomic
from targets.paths import cache_dir
from ..results import ArtifactInfo, Backend, CellError, LatencyStats, Placement, Record
from .stage_lines import START, read_message, stage_message  # noqa: F401 (the stage lines are part of this protocol)

# The worker's stages, in order; a progress bar counts them.
STAGES = ("prepare", "open", "contract", "parity", "rollout", "latency", "placement")
STAGES_AFTER_PARITY = ("rollout", "latency", "placement")  # failing here keeps the parity measured before
DONE = "done"  # the worker finished every stage
# Within "open": the cold start's first call of the session just opened. A failure there is the runtime running the
# model, not loading it; only a failure is named so: the gate, the timeline and a timeout keep the stage "open", which
# times the two together.
FIRST_RUN = "first run"
SERVICE = "service"  # the core's own stage: a run-scoped service (one browser) the cell needs

# Files of a cell folder.
SPEC_FILE = "spec.json"
MEASUREMENT_FILE = "measurement.json"
OUTPUTS_FILE = "outputs.npz"
LOG_FILE = "worker.log"


# A serving worker asks before each stage (gate_message) and waits for GO on stdin: the parent lets
# untimed work (opening, contract, parity, rollouts, placement) of several targets run side by side,
# and timed work (latency, cold start) only with nothing else running (cells.StageGate).
TIMED, UNTIMED = "timed", "untimed"
GO = "go"


def gate_message(kind: str) -> str:
    return json.dumps({"gate": kind})


def done_message(cell_dir: Path) -> str:
    """The line a serving worker prints when a cell's files are complete."""
    return json.dumps({"done": str(cell_dir)})


@dataclass(kw_only=True)
class CellInputs:
    """What every cell of a run shares: the observation set, the core's ONNX variants, how to time."""

    observations: str  # .npz of the observation set
    onnx_variants: dict[str, str]  # the core's ONNX files per variant
    variant_errors: dict[str, str] = field(default_factory=dict)
    cache_dir: str = field(default_factory=lambda: str(cache_dir()))
    batch_sizes: list[int] = field(default_factory=lambda: list(options.DEFAULT_BATCH_SIZES))
    symbolic_batch: bool = True
    chunk: int = 0  # run the observation set in chunks of a fixed batch (0: all at once)
    warmup: int = options.DEFAULT_WARMUP
    iters: int = options.DEFAULT_ITERS
    threads: int = options.DEFAULT_THREADS
    batch_axes: dict[str, int] = field(default_factory=dict)  # batch_axes.infer: inputs absent are fed whole, never sliced
    latency_budget_s: float = 30.0  # per batch size: timing stops here and says how many calls it timed
    rollout: dict | None = None  # rollouts.RolloutPlan as a dict: drive episodes with this cell's session

    def for_cell(self, configuration: Configuration, *, rollout: bool = False, **changes) -> CellSpec:
        """This run's inputs as the spec of the cell `configuration` names; `changes` override shared fields (a
        subset, other files). Episodes only when asked: a derived cell (a diagnosis, a fix attempt) is judged on
        parity, and driving episodes there would measure what is thrown away."""
        shared = {f.name: getattr(self, f.name) for f in fields(CellInputs)}
        return CellSpec(**{**shared, "rollout": self.rollout if rollout else None, "target": configuration.target_label,
                           "variant": configuration.variant, "candidate": configuration.candidate,
                           "settings": configuration.knobs, **changes})


@dataclass(kw_only=True)
class CellSpec(CellInputs):
    """What a worker needs to run one cell, written to its spec.json."""

    target: str
    variant: str
    settings: dict[str, str] = field(default_factory=dict)  # runtime knobs handed to target.open ({}: defaults)
    candidate: str = ""  # which model's variants these are ("" : the first model)

    @property
    def configuration(self) -> Configuration:
        return Configuration.of(self.target, self.variant, self.candidate, self.settings)

    def write(self, cell_dir: Path) -> None:
        (cell_dir / SPEC_FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, cell_dir: Path) -> CellSpec:
        return cls(**json.loads((cell_dir / SPEC_FILE).read_text()))


class Measurement(Record):
    """What a worker measured, rewritten after every stage: a worker killed in a late stage leaves
    what it had (and the `stage` it was in, other than "done")."""

    stage: str = START
    timeline: dict[str, float] = {}  # wall-clock start of each stage (bench/matrix_wall.py)
    gate_wait_s: dict[str, float] = {}  # seconds waited for the stage gate, per stage it fell in
    worker_pid: int | None = None
    runtime_version: str = ""
    artifact: ArtifactInfo | None = None
    cold_start_ms: float | None = None
    backend: Backend | None = None
    latency: list[LatencyStats] = []
    placement: list[Placement] = []
    rollout: dict | None = None  # rollouts.drive's record; rollouts.summarise reads it
    notes: list[str] = []
    error: CellError | None = None
    skip: str | None = None  # the target's reason this cell cannot run on this host
    traceback: str | None = None

    @property
    def stopped_itself(self) -> bool:
        """The worker said why it stopped: an error it caught or a skip (not a kill, not a timeout)."""
        return self.error is not None or self.skip is not None

    def save(self, cell_dir: Path) -> None:
        """Written whole, then swapped in: a kill mid-write never leaves half a file."""
        write_atomic(cell_dir / MEASUREMENT_FILE, self.model_dump_json(fallback=_plain))

    @classmethod
    def read(cls, cell_dir: Path) -> Measurement | None:
        """None when absent or cut short (a worker killed while writing); a file that is not a
        measurement is the worker's error, said as such."""
        try:
            data = json.loads((cell_dir / MEASUREMENT_FILE).read_text())
        except (OSError, ValueError):
            return None
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            message = f"the worker wrote an invalid {MEASUREMENT_FILE}: {' '.join(str(error).split())[:300]}"
            return cls(error=CellError(stage=START, message=message))


def _plain(value):
    """A value a runtime or environment handed back that JSON has no type for: numpy scalars as
    Python numbers, anything else as its text."""
    return value.item() if isinstance(value, np.generic) else str(value)
