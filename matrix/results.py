"""The results schema: what a run writes, what merge, compare and the report read.

Plain data, versioned. A shard (one host's run) and a merged file have the
same shape; merged files simply hold several hosts. Bump SCHEMA_VERSION on any
change that an older reader would misread.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
VERDICTS = ("PASS", "WARN", "FAIL", "SKIP")


class LatencyStats(BaseModel):
    batch: int
    n: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float
    std_us: float
    min_us: float


class OutputParity(BaseModel):
    output: str
    kind: str  # "continuous" | "discrete"
    max_abs: float
    mean_abs: float
    p99_abs: float
    max_rel: float
    vs_baseline_max_abs: float | None = None  # against ORT CPU fp32, the development runtime
    agreement: float | None = None  # discrete: share of actions equal to the reference
    flips: int | None = None  # discrete: disagreements where the reference margin exceeds tolerance
    near_ties: int | None = None  # discrete: disagreements on near-tied logits (not counted)


class ContractCheck(BaseModel):
    name: str
    ok: bool | None  # None: not applicable to this model
    detail: str = ""


class Placement(BaseModel):
    node: str
    op_type: str
    where: str
    fallback: bool


class Backend(BaseModel):
    requested: str
    actual: str
    emulated: bool = False
    detail: str = ""


class ArtifactInfo(BaseModel):
    size_bytes: int
    conversion_s: float
    op_inventory: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class CellError(BaseModel):
    stage: str
    message: str


class NodeDrift(BaseModel):
    """One node's first comparable output against the float64 reference (diagnose.py)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")  # an overflow's drift is inf: keep it, as valid JSON

    node: str
    op_type: str
    output: str
    drift: float  # max |y - y_ref|
    threshold: float  # level x max(1, max |y_ref|)
    reference_peak: float  # max |y_ref|
    input_drifts: dict[str, float | None] = Field(default_factory=dict)  # first divergent node only
    cause: str = ""  # a known cause in plain words, when the numbers match one


class Diagnosis(BaseModel):
    runtime: str
    observations: int
    threshold_rule: str
    level: float  # the cell's tolerance (FAIL) or half of it (WARN)
    nodes: list[NodeDrift] = Field(default_factory=list)  # original topological order
    first: NodeDrift | None = None
    note: str = ""


class FixAttempt(BaseModel):
    """One graph preparation tried on a failing cell, through the same target (preparations.py)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

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


class Cell(BaseModel):
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
    diagnosis: Diagnosis | None = None  # --diagnose: first divergent node of a drifting cell
    fixes: list[FixAttempt] = Field(default_factory=list)  # --assist: preparations tried on a failing cell

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.host, self.target, self.variant)

    @property
    def max_drift(self) -> float | None:
        drifts = [p.max_abs for p in self.parity if p.kind == "continuous"]
        return max(drifts) if drifts else None


class Host(BaseModel):
    label: str
    os: str
    arch: str
    cpu: str
    python: str
    packages: dict[str, str] = Field(default_factory=dict)


class LintResult(BaseModel):
    id: str
    level: str
    message: str


class Regression(BaseModel):
    host: str
    target: str
    variant: str
    kind: str  # verdict | drift | latency | fallback
    detail: str

    def __str__(self) -> str:
        return f"{self.host} {self.target} {self.variant} [{self.kind}] {self.detail}"


class RunResults(BaseModel):
    schema_version: int = SCHEMA_VERSION
    tool_version: str
    created: str
    model: dict
    hosts: list[Host]
    settings: dict
    lints: list[LintResult]
    cells: list[Cell]
    regressions: list[Regression] = Field(default_factory=list)  # filled when compared with a baseline

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2))


def load(path: Path) -> RunResults:
    from .errors import InputError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: not a results file ({error})") from None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InputError(
            f"{path}: results schema version {data.get('schema_version')!r}, this policy-matrix reads {SCHEMA_VERSION}"
        )
    return RunResults.model_validate(data)


def append_jsonl(path: Path, cell: Cell) -> None:
    """One line per finished cell, flushed at once: partial results survive a killed run."""
    with path.open("a") as stream:
        stream.write(cell.model_dump_json() + "\n")
        stream.flush()

