"""The results schema: what a run writes, what merge, compare and the report read.

Plain data, versioned. A shard (one host's run) and a merged file have the
same shape; merged files simply hold several hosts. Bump SCHEMA_VERSION on any
change that an older reader would misread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import outdir
from .configuration import Configuration

# What ran where and on which backend: defined once, by the target interface that reports them.
from targets.base import BackendInfo as Backend
from targets.base import PlacementRow as Placement

SCHEMA_VERSION = 2  # 2: variants, vs_dev_runtime_max_abs, interrupted (v1 files are read through upgrade_v1)
VERDICTS = ("PASS", "WARN", "FAIL", "SKIP", "CONVERTED")
Verdict = Literal["PASS", "WARN", "FAIL", "SKIP", "CONVERTED"]
# A latency is a finite number of microseconds >= 0 (a coarse browser timer can read 0): NaN, a negative
# or an infinite one in a shard would break every comparison and chart that reads it.
Microseconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Record(BaseModel):
    """Every results record: an infinite drift (NaN outputs, an fp16 overflow) is written as the JSON
    string "Infinity" and read back as inf, rather than as null, which the reader would refuse.

    An empty list or dict default is written `= []` / `= {}`, not `Field(default_factory=list)`: pydantic copies a
    default for each instance either way, and a factory costs an inspect.signature of the builtin per field as the
    class is made (~3 ms of every run's start-up, on its way to the reference job)."""

    model_config = ConfigDict(ser_json_inf_nan="strings", validate_by_name=True, serialize_by_alias=True)


class LatencyStats(Record):
    batch: int = Field(ge=1)
    n: int = Field(ge=0)
    p50_us: Microseconds
    p90_us: Microseconds
    p99_us: Microseconds
    mean_us: Microseconds
    std_us: Microseconds
    min_us: Microseconds
    # the p50's noise band over the timed calls (matrix/judge/noise.py); None in results written before it existed
    p50_low_us: Microseconds | None = None
    p50_high_us: Microseconds | None = None

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
    judged_rows: int | None = None  # discrete: rows whose reference margin is above the tie margin (agreement's denominator)
    # continuous: the worst element's |y - y_ref| as a share of atol + rtol * |y_ref| (above 1: beyond the tolerance)
    tolerance_used: float | None = None


class ContractCheck(Record):
    name: str
    ok: bool | None  # None: not applicable to this model
    detail: str = ""


class ArtifactInfo(Record):
    size_bytes: int
    conversion_s: float
    op_inventory: dict[str, int] = {}
    notes: list[str] = []
    # int8: quantized_ops / float_ops / quantized_weights / float_weights, counted in the artifact itself, and
    # per_call_ops: ops that scale activations over each call's batch (dynamic int8), exempt from the batch evidence
    quantization: dict[str, int] | None = None
    # outputs returned on an integer grid (a full-integer file dequantizes them), by name -> the grid's step: a
    # bound the graph states is held to within half of it
    output_steps: dict[str, float] = {}


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
    episodes: list[EpisodeOutcome] = []
    mean_return: float | None = None
    std_return: float | None = None
    reference_mean_return: float | None = None
    reference_std_return: float | None = None
    return_delta: float | None = None  # mean return minus the reference's
    return_delta_rel: float | None = None  # divided by max(|reference mean return|, 1)
    # the paired per-seed return differences' t interval of the mean (matrix/judge/stats.py), at `confidence`
    return_delta_low: float | None = None
    return_delta_high: float | None = None
    confidence: float | None = None
    length_delta: float | None = None  # mean episode length minus the reference's
    action_agreement: float | None = None
    divergence_epsilon: float | None = None
    clip_actions: bool = False
    clipped_steps: int = 0
    steps: int = 0
    step_us: float | None = None  # wall time per step: runtime + environment + harness
    step_drift: list[float] = []  # open loop: max |action - reference| per recorded step
    max_step_drift: float | None = None


class NodeDrift(Record):
    """One node's first comparable output against the float64 reference (diagnose.py)."""

    node: str
    op_type: str
    output: str
    drift: float  # max |y - y_ref|
    threshold: float  # level x max(1, max |y_ref|)
    reference_peak: float  # max |y_ref|
    input_drifts: dict[str, float | None] = {}  # first divergent node only
    cause: str = ""  # a known cause in plain words, when the numbers match one


class Diagnosis(Record):
    runtime: str
    observations: int
    threshold_rule: str
    level: float  # the cell's tolerance (FAIL) or half of it (WARN)
    nodes: list[NodeDrift] = []  # original topological order
    first: NodeDrift | None = None
    note: str = ""


class FixAttempt(Record):
    """One graph preparation tried on a failing cell, through the same target (preparations.py)."""

    preparation: str  # e.g. "onnxsim (batch 1) + Min/Max -> Clip"
    steps: list[str] = []  # what each step changed, node names included
    verdict: str
    reasons: list[str] = []
    drift: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    timed_calls: int | None = None  # behind that p50/p99 (LatencyStats.n)
    batch: int | None = None
    emulated: bool = False
    prepared_onnx: str = ""  # path relative to the report folder
    size_bytes: int | None = None  # of prepared_onnx, the file that ships
    host_step: str = ""  # what the application must do on the host (e.g. argmax of the logits)


class Cell(Record):
    host: str
    target: str
    variant: str
    verdict: str  # one of VERDICTS (a file's cells are checked by ResultsShape; code may fill it in later)
    reasons: list[str] = []
    runtime_version: str = ""
    predicts: bool = True
    artifact: ArtifactInfo | None = None
    parity: list[OutputParity] = []
    latency: list[LatencyStats] = []
    cold_start_ms: float | None = None
    placement: list[Placement] = []
    contract: list[ContractCheck] = []
    backend: Backend | None = None
    error: CellError | None = None
    tolerance: float | None = None  # atol: the absolute part of the drift tolerance
    rtol: float | None = None  # the relative part: |y - y_ref| <= tolerance + rtol * |y_ref|
    duration_s: float = 0.0
    notes: list[str] = []  # how it was measured (e.g. a time-boxed latency)
    rollout: Rollout | None = None
    diagnosis: Diagnosis | None = None  # --diagnose: first divergent node of a drifting cell
    fixes: list[FixAttempt] = []  # --assist: preparations tried on a failing cell
    candidate: str = ""  # --candidate: which model ran ("" is the first model, the one under test)
    settings: dict[str, str] = {}  # --settings: runtime knobs of this cell ({}: defaults)

    @property
    def configuration(self) -> Configuration:
        """Every axis of this cell (matrix/configuration.py), from the fields this schema stores them in."""
        return Configuration.of(self.target, self.variant, self.candidate, self.settings)

    @property
    def key(self) -> tuple[str, ...]:
        """A cell's identity: the host and its configuration ((host, target, variant) alone collide)."""
        return (self.host, *self.configuration.key)

    @property
    def max_drift(self) -> float | None:
        drifts = [p.max_abs for p in self.parity if p.kind == "continuous"]
        return max(drifts) if drifts else None


class DecisionChoice(Record):
    """One configuration of a target, with the numbers it was judged on."""

    candidate: str = ""
    variant: str
    settings: dict[str, str] = {}
    verdict: str
    batch: int | None = None  # the smallest timed batch: its p50/p99 are the ones budgets apply to
    p50_us: float | None = None
    p99_us: float | None = None
    timed_calls: int | None = None  # behind that p50/p99: a tail is compared from decide.TAIL_CALLS on
    p50_low_us: float | None = None  # the p50's noise band (matrix/judge/noise.py): what "equally fast" is judged by
    p50_high_us: float | None = None
    size_bytes: int | None = None
    drift: float | None = None  # max |action - float64 reference of the first model| (continuous outputs)
    agreement: float | None = None  # discrete outputs: the lowest share of actions equal to the reference's
    flips: int | None = None  # discrete outputs: disagreements above the tie margin
    return_delta: float | None = None  # mean return minus the reference's, when rollouts ran
    return_delta_low: float | None = None  # its paired interval (Rollout.return_delta_low/high)
    return_delta_high: float | None = None
    emulated: bool = False  # software adapter: its latency never decides
    fix: str = ""  # the change it passes only after: a graph preparation (--assist), e.g. "simplify + minmax-clip",
    # or one the tool made so the runtime could load the file (WebGL's "a fixed batch of 1"); it ships as that, not as the export
    prepared_onnx: str = ""  # that change's file, or the cell's folder of its files (one per batch size), relative to the report folder
    misses: list[str] = []  # budgets (or quality) it does not meet: why it cannot ship
    flags: list[str] = []  # e.g. an int8 file larger than its fp32
    why: str = ""  # chosen: why it won
    lost: str = ""  # qualified but ranked lower: why it lost to the one above it

    def configuration(self, target: str) -> Configuration:
        """Its configuration on `target` (the Decision's): the cell it was measured as."""
        return Configuration.of(target, self.variant, self.candidate, self.settings)


class Decision(Record):
    """Per host and target: the cheapest configuration meeting every budget (decide.py)."""

    decision_version: int = 2
    host: str
    target: str
    prefer: str  # latency | size | accuracy: the order among configurations that meet every budget
    budgets: list[str] = []  # as given, e.g. "p50<=200us"
    chosen: DecisionChoice | None = None
    runner_up: DecisionChoice | None = None
    closest: DecisionChoice | None = None  # when nothing meets the budget: what came nearest, and why it misses
    considered: int = 0
    quality_bar: str = ""  # what "quality" meant for this target (drift tolerance or return tolerance)
    tie_rule: str = ""  # how those that qualify were ordered under `prefer`, ties included (decide.order_rule)
    not_ready: list[str] = []  # error-level lints: nothing is called shippable while they stand
    assisted: bool = False  # --assist ran: graph preparations were tried on the run's FAILed cells
    # what --assist tried on this target, per configuration ("fp16", "fp32 threads=2"), in the order tried
    fixes_tried: dict[str, list[str]] = {}
    # every configuration considered: those that qualify in rank order (each with why it lost), then those that
    # cannot ship (each with its misses)
    configurations: list[DecisionChoice] = []


class Host(Record):
    label: str
    os: str
    arch: str
    cpu: str
    python: str
    packages: dict[str, str] = {}


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


class BaselineCoverage(Record):
    """What a comparison with a baseline covered: 'no regressions' holds only for the cells compared. A baseline host
    the run has no cell of (a nightly shard that never arrived), cells only one side ran, or why nothing was compared
    (a baseline of another model or inputs, taken as a note by --baseline-mismatch note)."""

    compared: int = Field(ge=0)
    absent_hosts: dict[str, int] = {}  # a baseline host with no cell now -> its baseline cells
    only_in_baseline: list[str] = []  # "host target variant" of the hosts present in both
    only_in_current: list[str] = []  # new since the baseline: nothing to compare them with
    # cells the baseline measured that SKIP now (a runtime broken on tonight's runner) -> the reason they SKIP
    skipped_now: dict[str, str] = {}
    # a host whose processor changed since the baseline -> "old cpu -> new cpu": its cells' latency was not compared
    latency_not_compared: dict[str, str] = {}
    refused: str = ""  # why nothing was compared

    @property
    def whole(self) -> bool:
        """Every cell of the baseline was compared (cells new since then may be listed: they lose nothing)."""
        return not (self.refused or self.absent_hosts or self.only_in_baseline or self.skipped_now or self.latency_not_compared)

    def lines(self) -> list[str]:
        """One line per gap, in words, for the console, summary.md and the report."""
        if self.refused:
            return [f"not compared with the baseline: {self.refused}"]
        found = [f"not compared: host {host} ({cells} cell{'s' if cells > 1 else ''} in the baseline) has no cell in the "
                 "current run" for host, cells in self.absent_hosts.items()]
        if self.only_in_baseline:
            found.append(f"not compared: {_counted(self.only_in_baseline)} of the baseline not in the current run: "
                         f"{_listed(self.only_in_baseline)}")
        for why, cells in _by_reason(self.skipped_now).items():
            found.append(f"not compared: {_counted(cells)} the baseline measured SKIP now: {_listed(cells)} ({why})")
        found += [f"latency not compared on host {host}: its processor changed ({change}); a slower processor is not a "
                  "slower runtime" for host, change in self.latency_not_compared.items()]
        if self.only_in_current:
            found.append(f"new since the baseline (nothing to compare with): {_counted(self.only_in_current)}: "
                         f"{_listed(self.only_in_current)}")
        return found


def _by_reason(skipped: dict[str, str]) -> dict[str, list[str]]:
    cells: dict[str, list[str]] = {}
    for cell, why in skipped.items():
        cells.setdefault(why, []).append(cell)
    return cells


def _counted(cells: list[str]) -> str:
    return f"{len(cells)} cell{'s' if len(cells) > 1 else ''}"


def _listed(cells: list[str], shown: int = 8) -> str:
    return ", ".join(cells[:shown]) + (f" and {len(cells) - shown} more" if len(cells) > shown else "")


class Interruption(Record):
    """A run stopped before its last cell (Ctrl-C or SIGTERM): the report holds the finished cells."""

    after_cells: int = Field(ge=0)
    signal: Literal["SIGINT", "SIGTERM"]
    host: str = ""  # in a merge: the host whose shard was interrupted

    def describe(self) -> str:
        where = f"{self.host}: " if self.host else ""
        return f"{where}interrupted ({self.signal}) after {self.after_cells} cells: this report holds the finished cells only"


class RunResults(Record):
    schema_version: int = SCHEMA_VERSION
    tool_version: str
    created: str
    model: dict
    hosts: list[Host]
    run_options: dict = Field(alias="settings")  # the run's options ("settings" in results.json since version 1)
    lints: list[LintResult]
    cells: list[Cell]
    regressions: list[Regression] = []  # filled when compared with a baseline
    baseline: BaselineCoverage | None = None  # with a baseline: what was compared, what could not be
    # variants the tool itself could not make (its problem, reported once; their cells are SKIP)
    variant_errors: dict[str, str] = {}
    # variants the run did not make, the model as given being that precision already (a decision; cells SKIP with why)
    variants_not_made: dict[str, str] = {}
    # Optional and additive (older readers ignore them): the grid that ran and what it decided.
    grid: dict = {}  # candidates, settings per target, number of configurations
    decision: list[Decision] = []
    interrupted: Interruption | None = None
    # In a merge: every interrupted shard, each with its host (`interrupted` is the first, for older readers).
    interrupted_shards: list[Interruption] = []
    # `--require`d targets whose every cell SKIPped: the run fails for them (exit 1, junit, summary.md).
    required_not_run: list[str] = []
    # In a merge: the hosts whose shard required each of those targets (a run's are its one host's).
    required_on: dict[str, list[str]] = {}

    def interruptions(self) -> list[Interruption]:
        """Every interruption the report must name: a merge's each interrupted shard, a run's own."""
        return self.interrupted_shards or ([self.interrupted] if self.interrupted else [])

    @model_validator(mode="after")
    def _cells_are_unique(self) -> "RunResults":
        seen = set()
        for cell in self.cells:
            if cell.key in seen:
                raise ValueError(f"cell {' '.join(filter(None, cell.key))} appears twice")
            seen.add(cell.key)
        return self

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2))


class ModelSummary(BaseModel):
    """The keys of `RunResults.model` that merge, compare and the report rely on (others are kept as they are)."""

    model_config = ConfigDict(extra="allow")
    name: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    node_names: list[str] = []


class AskedDecision(BaseModel):
    budgets: list[str] = []
    prefer: Literal["latency", "size", "accuracy"] = "latency"


class RunOptionsSummary(BaseModel):
    """The keys of `RunResults.run_options` that readers use, each optional (older files lack some)."""

    model_config = ConfigDict(extra="allow")
    batch_sizes: list[Annotated[int, Field(ge=1)]] | None = None
    warmup: int | None = Field(None, ge=0)
    iters: int | None = Field(None, ge=1)
    threads: int | None = Field(None, ge=1)
    targets: list[str] | None = None
    variants: list[str] | None = None
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    tolerances: dict[str, Annotated[float, Field(ge=0)]] | None = None
    tie_margin: float | None = Field(None, ge=0, allow_inf_nan=False)
    min_agreement: float | None = Field(None, ge=0, le=1)
    decision: AskedDecision | None = None
    rollout: dict | None = None
    run_id: str | None = None
    shards: list[str] | None = None


class CellShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    verdict: Verdict


class ResultsShape(BaseModel):
    """What a results file must hold beyond RunResults' own types: checked first, so a shard's
    malformed `model` or `settings` (the run's options), or an unknown verdict, is one line naming the field, not an
    error deep in merge, compare or the report."""

    model_config = ConfigDict(extra="allow")
    model: ModelSummary
    run_options: RunOptionsSummary = Field(alias="settings")
    cells: list[CellShape]


def load(path: Path) -> RunResults:
    """A results file the user gave (a shard, a baseline): bounded, every field validated (matrix.validated)."""
    from . import validated
    from .errors import InputError
    from .userfiles import one_line

    data = validated.json_file(Path(path), "results")
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a results file (a JSON {type(data).__name__}, not an object)")
    if "schema_version" not in data:  # another tool's JSON: no version of ours to name
        raise InputError(f"{path}: not a policy-matrix results file (no schema_version)")
    if data.get("schema_version") == 1:
        data = upgrade_v1(data)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InputError(
            f"{path}: results schema version {one_line(repr(data.get('schema_version')), 40)}, this policy-matrix reads {SCHEMA_VERSION}"
        )
    validated.model(ResultsShape, data, f"{path}: not a valid results file")
    return validated.model(RunResults, data, f"{path}: not a valid results file")


def upgrade_v1(data: dict) -> dict:
    """A version-1 results file in version 2's names, so compare and merge read an old baseline:
    `precisions` became `variants`, `vs_baseline_max_abs` (ORT CPU fp32) `vs_dev_runtime_max_abs`
    ("baseline" now only means an earlier results.json), and the interruption a field of its own."""
    run_options, cells = data.get("settings") or {}, data.get("cells") or []
    if not isinstance(run_options, dict) or not isinstance(cells, list):
        return {**data, "schema_version": 2}  # validation names what is wrong with them
    run_options = renamed(dict(run_options), "precisions", "variants")
    interrupted = None
    if "interrupted_after_cells" in run_options:
        interrupted = {"after_cells": run_options.pop("interrupted_after_cells"),
                       "signal": run_options.pop("interrupted_by", "SIGINT")}
    cells = [upgrade_v1_cell(cell) for cell in cells]
    return {**data, "schema_version": 2, "settings": run_options, "cells": cells, "interrupted": interrupted}


def upgrade_v1_cell(cell: dict) -> dict:
    """One cell in version 2's names (results.json, and results.jsonl lines of an earlier run)."""
    if not isinstance(cell, dict):
        return cell  # validation names what is wrong with it
    parity = cell.get("parity") or []
    if not isinstance(parity, list):
        return cell
    return {**cell, "parity": [renamed(p, "vs_baseline_max_abs", "vs_dev_runtime_max_abs") for p in parity]}


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
    outdir.append_line(path, line + "\n")

