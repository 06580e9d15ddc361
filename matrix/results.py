"""The results schema: what a run writes, what merge, compare and the report read.

Plain data, versioned. A shard (one host's run) and a merged file have the
same shape; merged files simply hold several hosts. Bump SCHEMA_VERSION on any
change that an older reader would misread.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# What ran where and on which backend: defined once, by the target interface that reports them.
from targets.base import BackendInfo as Backend
from targets.base import PlacementRow as Placement

SCHEMA_VERSION = 2  # 2: variants, vs_dev_runtime_max_abs, interrupted (v1 files are read through upgrade_v1)
VERDICTS = ("PASS", "WARN", "FAIL", "SKIP", "CONVERTED")


class Record(BaseModel):
    """Every results record: an infinite drift (NaN outputs, an fp16 overflow) is written as the JSON
    string "Infinity" and read back as inf, rather than as null, which the reader would refuse."""

    model_config = ConfigDict(ser_json_inf_nan="strings")


class LatencyStats(Record):
    batch: int
    n: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float
    std_us: float
    min_us: float
    # the p50's noise band over the timed calls (matrix/noise.py); None in results written before it existed
    p50_low_us: float | None = None
    p50_high_us: float | None = None

    @property
    def p50_band(self) -> tuple[float, float] | None:
        return (self.p50_low_us, self.p50_high_us) if self.p50_low_us is not None and self.p50_high_us is not None else None


class OutputParity(Record):
    output: str
    kind: str  # "continuous" | "discrete"
    max_abs: float
    mean_abs: float
    p99_abs: float
    max_rel: float
    vs_dev_runtime_max_abs: float | None = None  # against ORT CPU fp32, the development runtime
    agreement: float | None = None  # discrete: share of actions equal to the reference
    flips: int | None = None  # discrete: disagreements where the reference margin exceeds the tie margin
    near_ties: int | None = None  # discrete: disagreements on near-tied logits (not counted)


class ContractCheck(Record):
    name: str
    ok: bool | None  # None: not applicable to this model
    detail: str = ""


class ArtifactInfo(Record):
    size_bytes: int
    conversion_s: float
    op_inventory: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    # int8: quantized_ops / float_ops / quantized_weights / float_weights, counted in the artifact itself
    quantization: dict[str, int] | None = None


class CellError(Record):
    stage: str
    message: str


class EpisodeOutcome(Record):
    seed: int  # the episode reset with env.reset(seed=seed)
    episode_return: float
    length: int
    reference_return: float
    reference_length: int
    divergence_step: int | None = None  # first step whose observation left the reference's (None: never)
    action_agreement: float | None = None  # share of common steps whose action equals the reference's
    clipped_steps: int = 0


class Rollout(Record):
    """Behaviour in the loop (`--env` closed loop, or `--trajectory` open loop).

    Optional and additive: readers that predate it ignore the field, so the
    schema version stays; `rollout_version` versions this record itself.
    """

    rollout_version: int = 1
    mode: str  # "closed-loop" | "open-loop"
    env: str = ""
    episodes: list[EpisodeOutcome] = Field(default_factory=list)
    mean_return: float | None = None
    std_return: float | None = None
    reference_mean_return: float | None = None
    reference_std_return: float | None = None
    return_delta: float | None = None  # mean return minus the reference's
    return_delta_rel: float | None = None  # divided by max(|reference mean return|, 1)
    length_delta: float | None = None  # mean episode length minus the reference's
    action_agreement: float | None = None
    divergence_epsilon: float | None = None
    clip_actions: bool = False
    clipped_steps: int = 0
    steps: int = 0
    step_us: float | None = None  # wall time per step: runtime + environment + harness
    step_drift: list[float] = Field(default_factory=list)  # open loop: max |action - reference| per recorded step
    max_step_drift: float | None = None


class NodeDrift(Record):
    """One node's first comparable output against the float64 reference (diagnose.py)."""

    node: str
    op_type: str
    output: str
    drift: float  # max |y - y_ref|
    threshold: float  # level x max(1, max |y_ref|)
    reference_peak: float  # max |y_ref|
    input_drifts: dict[str, float | None] = Field(default_factory=dict)  # first divergent node only
    cause: str = ""  # a known cause in plain words, when the numbers match one


class Diagnosis(Record):
    runtime: str
    observations: int
    threshold_rule: str
    level: float  # the cell's tolerance (FAIL) or half of it (WARN)
    nodes: list[NodeDrift] = Field(default_factory=list)  # original topological order
    first: NodeDrift | None = None
    note: str = ""


class FixAttempt(Record):
    """One graph preparation tried on a failing cell, through the same target (preparations.py)."""

    preparation: str  # e.g. "onnxsim (batch 1) + Min/Max -> Clip"
    steps: list[str] = Field(default_factory=list)  # what each step changed, node names included
    verdict: str
    reasons: list[str] = Field(default_factory=list)
    drift: float | None = None
    p50_us: float | None = None
    batch: int | None = None
    emulated: bool = False
    prepared_onnx: str = ""  # path relative to the report folder
    host_step: str = ""  # what the application must do on the host (e.g. argmax of the logits)


class Cell(Record):
    host: str
    target: str
    variant: str
    verdict: str
    reasons: list[str] = Field(default_factory=list)
    runtime_version: str = ""
    predicts: bool = True
    artifact: ArtifactInfo | None = None
    parity: list[OutputParity] = Field(default_factory=list)
    latency: list[LatencyStats] = Field(default_factory=list)
    cold_start_ms: float | None = None
    placement: list[Placement] = Field(default_factory=list)
    contract: list[ContractCheck] = Field(default_factory=list)
    backend: Backend | None = None
    error: CellError | None = None
    tolerance: float | None = None
    duration_s: float = 0.0
    notes: list[str] = Field(default_factory=list)  # how it was measured (e.g. a time-boxed latency)
    rollout: Rollout | None = None
    diagnosis: Diagnosis | None = None  # --diagnose: first divergent node of a drifting cell
    fixes: list[FixAttempt] = Field(default_factory=list)  # --assist: preparations tried on a failing cell
    candidate: str = ""  # --candidate: which model ran ("" is the first model, the one under test)
    settings: dict[str, str] = Field(default_factory=dict)  # --settings: runtime knobs of this cell ({}: defaults)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """A cell's identity: with candidates and settings, (host, target, variant) alone collide."""
        return (self.host, self.target, self.variant, self.candidate, self.settings_label)

    @property
    def settings_label(self) -> str:
        return settings_label(self.settings)

    @property
    def configuration(self) -> str:
        """The non-default axes, e.g. "student.onnx · threads=2": empty for a plain run's cell."""
        return " · ".join(part for part in (self.candidate, self.settings_label) if part)

    @property
    def max_drift(self) -> float | None:
        drifts = [p.max_abs for p in self.parity if p.kind == "continuous"]
        return max(drifts) if drifts else None


def settings_label(settings: dict[str, str]) -> str:
    return ",".join(f"{knob}={value}" for knob, value in sorted(settings.items()))


class DecisionChoice(Record):
    """One configuration of a target, with the numbers it was judged on."""

    candidate: str = ""
    variant: str
    settings: dict[str, str] = Field(default_factory=dict)
    verdict: str
    batch: int | None = None  # the smallest timed batch: its p50/p99 are the ones budgets apply to
    p50_us: float | None = None
    p99_us: float | None = None
    size_bytes: int | None = None
    drift: float | None = None  # max |action - float64 reference of the first model|
    return_delta: float | None = None  # mean return minus the reference's, when rollouts ran
    emulated: bool = False  # software adapter: its latency never decides
    misses: list[str] = Field(default_factory=list)  # budgets (or quality) it does not meet


class Decision(Record):
    """Per host and target: the cheapest configuration meeting every budget (decide.py)."""

    decision_version: int = 1
    host: str
    target: str
    prefer: str  # latency | size | accuracy: the order among configurations that meet every budget
    budgets: list[str] = Field(default_factory=list)  # as given, e.g. "p50<=200us"
    chosen: DecisionChoice | None = None
    runner_up: DecisionChoice | None = None
    closest: DecisionChoice | None = None  # when nothing meets the budget: what came nearest, and why it misses
    considered: int = 0
    quality_bar: str = ""  # what "quality" meant for this target (drift tolerance or return tolerance)


class Host(Record):
    label: str
    os: str
    arch: str
    cpu: str
    python: str
    packages: dict[str, str] = Field(default_factory=dict)


class LintResult(Record):
    id: str
    level: str
    message: str


class Regression(Record):
    host: str
    target: str
    variant: str
    kind: str  # verdict | drift | latency | fallback
    detail: str
    configuration: str = ""  # candidate and settings of the cell, when not the defaults

    def __str__(self) -> str:
        where = f"{self.variant} {self.configuration}" if self.configuration else self.variant
        return f"{self.host} {self.target} {where} [{self.kind}] {self.detail}"


class Interruption(Record):
    """A run stopped before its last cell (Ctrl-C or SIGTERM): the report holds the finished cells."""

    after_cells: int
    signal: str  # "SIGINT" | "SIGTERM"

    def describe(self) -> str:
        return f"interrupted ({self.signal}) after {self.after_cells} cells: this report holds the finished cells only"


class RunResults(Record):
    schema_version: int = SCHEMA_VERSION
    tool_version: str
    created: str
    model: dict
    hosts: list[Host]
    settings: dict
    lints: list[LintResult]
    cells: list[Cell]
    regressions: list[Regression] = Field(default_factory=list)  # filled when compared with a baseline
    # variants the tool itself could not make (its problem, reported once; their cells are SKIP)
    variant_errors: dict[str, str] = Field(default_factory=dict)
    # Optional and additive (older readers ignore them): the grid that ran and what it decided.
    grid: dict = Field(default_factory=dict)  # candidates, settings per target, number of configurations
    decision: list[Decision] = Field(default_factory=list)
    interrupted: Interruption | None = None

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2))


def load(path: Path) -> RunResults:
    from .errors import InputError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: not a results file ({error})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a results file (a JSON {type(data).__name__}, not an object)")
    if data.get("schema_version") == 1:
        data = upgrade_v1(data)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InputError(
            f"{path}: results schema version {data.get('schema_version')!r}, this policy-matrix reads {SCHEMA_VERSION}"
        )
    try:
        return RunResults.model_validate(data)
    except ValueError as error:  # pydantic's ValidationError: name the first bad field only
        raise InputError(f"{path}: not a valid results file ({' '.join(str(error).split())[:300]})") from None


def upgrade_v1(data: dict) -> dict:
    """A version-1 results file in version 2's names, so compare and merge read an old baseline:
    `precisions` became `variants`, `vs_baseline_max_abs` (ORT CPU fp32) `vs_dev_runtime_max_abs`
    ("baseline" now only means an earlier results.json), and the interruption a field of its own."""
    settings = renamed(dict(data.get("settings") or {}), "precisions", "variants")
    interrupted = None
    if "interrupted_after_cells" in settings:
        interrupted = {"after_cells": settings.pop("interrupted_after_cells"),
                       "signal": settings.pop("interrupted_by", "SIGINT")}
    cells = [upgrade_v1_cell(cell) for cell in data.get("cells") or []]
    return {**data, "schema_version": 2, "settings": settings, "cells": cells, "interrupted": interrupted}


def upgrade_v1_cell(cell: dict) -> dict:
    """One cell in version 2's names (results.json, and results.jsonl lines of an earlier run)."""
    if not isinstance(cell, dict):
        return cell  # validation names what is wrong with it
    parity = [renamed(p, "vs_baseline_max_abs", "vs_dev_runtime_max_abs") for p in cell.get("parity") or []]
    return {**cell, "parity": parity}


def renamed(record, old: str, new: str):
    """`record` with its key `old` called `new` (a copy; anything else as it is)."""
    if isinstance(record, dict) and old in record:
        record = {**record, new: record[old]}
        del record[old]
    return record


def append_jsonl(path: Path, cell: Cell, **stamp: str) -> None:
    """One line per finished cell, flushed at once: partial results survive a killed run.
    `stamp` (run id, model hash) goes first on the line so runs sharing the file stay apart."""
    line = json.dumps({**stamp, **cell.model_dump(mode="json")}) if stamp else cell.model_dump_json()
    with path.open("a") as stream:
        stream.write(line + "\n")
        stream.flush()

