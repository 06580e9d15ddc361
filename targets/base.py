"""The one small interface every runtime target implements.

A target turns the policy into an artifact for one precision (`prepare`), opens
it (`open`) and answers through a `Session`: outputs, per-call latencies taken
with the runtime's own clock, per-node placement and the backend that really
ran. The core never asks which target it is talking to.

Everything here is plain data or a thin runtime handle, so a cell worker can
run any target the same way: files in, JSON out.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import numpy as np

VARIANTS = ("fp32", "fp16", "int8")
NOT_MADE = "not made: "  # how a variant's reason starts when the run decided not to make it (matrix.run.variants)

Feeds = dict[str, np.ndarray]
Settings = Mapping[str, str]  # runtime knob -> value for one cell (empty: the target's defaults)
NO_SETTINGS: Settings = MappingProxyType({})


@dataclass(frozen=True)
class Knob:
    """A real runtime setting a target exposes to the settings grid (`--settings TARGET:KNOB=V1,V2`)."""

    meaning: str
    choices: tuple[str, ...] = ()  # the values it takes; () means a positive integer (a thread count)
    default: str = ""  # the value the runtime takes when the knob is not set ("": the run's own, e.g. --threads)

    def problem(self, value: str) -> str | None:
        """None when `value` is one this knob takes, else what it takes."""
        if self.choices:
            return None if value in self.choices else f"one of {', '.join(self.choices)}"
        return None if value.isdigit() and int(value) >= 1 else "a whole number >= 1"


class CellSkip(Exception):
    """Raised by a target when a cell cannot run on this host (the reason is shown)."""


class VariantMissing(CellSkip):
    """The tool could not make the variant this cell needs: the tool's problem, not the runtime's."""


def head(feeds: Feeds, rows: int, batch_axes: Mapping[str, int]) -> Feeds:
    """At most the first `rows` observations, cut along each input's batch axis; inputs without one whole."""
    return {name: np.ascontiguousarray(array[(slice(None),) * batch_axes[name] + (slice(0, rows),)])
            if name in batch_axes else array for name, array in feeds.items()}


@dataclass
class PrepareContext:
    """What a target may use to build its artifact for one cell."""

    onnx_variants: dict[str, Path]  # the core's ONNX fp32/fp16/int8 files
    calibration: Feeds  # the run's observation set (int8 calibration data), each input's batch on its own axis
    batch_axes: dict[str, int]  # input (and output) name -> its batch axis; an input absent is fed whole
    workdir: Path  # private to this cell
    cache_dir: Path  # shared across runs; key entries by content hash
    threads: int = 1
    variant_errors: dict[str, str] = field(default_factory=dict)  # variants the core could not make
    variant_seconds: dict[str, float] = field(default_factory=dict)  # how long the core took to make each
    variant_notes: dict[str, list[str]] = field(default_factory=dict)  # how the core made each (nodes kept in fp32)

    def calibration_head(self, rows: int) -> Feeds:
        """The first `rows` observations, cut along each input's batch axis; inputs without one whole."""
        return head(self.calibration, rows, self.batch_axes)

    def calibration_samples(self, limit: int) -> list[Feeds]:
        """Up to `limit` observations, each as it is fed at batch 1 (a 1 on each input's batch axis)."""
        batched = [(name, axis) for name, axis in self.batch_axes.items() if name in self.calibration]
        total = self.calibration[batched[0][0]].shape[batched[0][1]] if batched else 1
        return [{name: np.take(array, [row], axis=self.batch_axes[name]) if name in self.batch_axes else array
                 for name, array in self.calibration.items()} for row in range(min(total, limit))]

    @property
    def fp32_model(self) -> Path:
        return self.onnx_variant("fp32")

    def onnx_variant(self, variant: str) -> Path:
        if self.variant_errors.get(variant, "").startswith(NOT_MADE):
            raise CellSkip(f"not run: the {variant} variant is {self.variant_errors[variant]}")
        if variant in self.variant_errors:
            raise VariantMissing(f"not run: the tool could not make the {variant} ONNX variant ({self.variant_errors[variant]})")
        return self.onnx_variants[variant]


@dataclass
class Artifact:
    """What prepare made, and all that open() gets from it: a target that needs more to open its
    artifact (a conversion record, the ONNX names behind a converted file) subclasses this with typed fields."""

    path: Path
    conversion_s: float = 0.0
    op_inventory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    variant: str = "fp32"  # the precision this artifact is
    cache_dir: Path | None = None  # where files derived from it are cached (WebGL's fixed-batch copies need one)
    batch_axes: dict[str, int] = field(default_factory=dict)  # the ONNX file's batch axis per input/output (fixed-batch copies)
    # int8: how many ops/weights the artifact really holds quantized (None: count its ONNX file)
    quantization: dict[str, int] | None = None
    # ONNX output name -> the step of the integer grid it is returned on (a full-integer file's dequantized outputs)
    output_steps: dict[str, float] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        if self.path.is_dir():
            return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
        return self.path.stat().st_size


@dataclass
class PlacementRow:
    node: str  # ONNX node name (or the runtime's op name where no ONNX node maps)
    op_type: str
    where: str  # execution provider / delegate / device that ran it
    fallback: bool  # True when it did not run on the requested accelerator


# Where the runtime said nothing of the backend it ran on (ORT logged no node placement: every node folded away at
# load, or a release whose log reads otherwise): not seen missing, so not judged as missing.
UNREAD = "unknown"


@dataclass
class BackendInfo:
    requested: str
    actual: str  # the backend it ran on, as the runtime says; UNREAD where nothing says it
    emulated: bool = False  # software adapter: parity is meaningful, latency is not
    detail: str = ""
    timer_resolution_us: float | None = None  # the latency clock's step where it is coarse (a browser page)

    @property
    def matches(self) -> bool:
        return self.requested == self.actual


# An emulated (software) adapter's latency means nothing: it is never compared, never decides, and the
# report says "parity only"; yet it is timed alone (matrix.run.cells.StageGate), at 15-65 ms a call on an
# MLP under SwiftShader WebGPU and ~0.3 s on a conv policy at batch 64. So the worker times 1 warm-up and
# 5 calls at the smallest batch size only (matrix.run.worker.timed_batches), without the probe round that
# sizes real timing (matrix.run.worker.timed_calls): enough for its order of magnitude. 3 probe + 3 warm-up +
# 20 calls made it most of a full matrix's timed seconds; 1 + 5 at every batch size still ~8 s of a pixel CNN's.
EMULATED_WARMUP, EMULATED_ITERS = 1, 5


@dataclass(frozen=True)
class Preparation:
    """A copy or rewrite of the exported file that a session ran instead of it, because the runtime rejected it."""

    name: str  # e.g. "a fixed batch of 1 and 64"
    exported_error: str  # the runtime's own words on the exported file, in this run
    files: dict[str, Path]  # file name to save it under -> the prepared file


class Session(ABC):
    """An opened artifact. Latencies are per-call nanoseconds from the runtime's side.

    Usable as a context manager: `with target.open(artifact, threads) as session:` closes it."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    @abstractmethod
    def run(self, feeds: Feeds) -> Feeds: ...

    @abstractmethod
    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]: ...

    @abstractmethod
    def placement(self) -> list[PlacementRow]: ...

    @abstractmethod
    def backend(self) -> BackendInfo: ...

    def preparation(self) -> Preparation | None:
        """What this session ran instead of the exported file, and why (None: the file as exported)."""
        return None

    def close(self) -> None:
        """Release the runtime; the default has nothing to release."""


class RunService(ABC):
    """A process shared by the cells of a run (e.g. one browser), started by the core."""

    @abstractmethod
    def env(self) -> dict[str, str]:
        """Environment handed to each cell worker so it can reach the service."""

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def stop(self) -> None: ...


class Target(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    variants: ClassVar[tuple[str, ...]] = VARIANTS
    # False for conversion-only cells (e.g. CoreML on Linux): verdict comes from prepare.
    predicts: ClassVar[bool] = True
    # Targets with the same key share one RunService per run.
    service_key: ClassVar[str | None] = None
    # Targets with the same key are served by one worker process, one after another in grid order
    # (matrix.run.orchestrate.CellSchedule): they share something large the worker holds (one browser,
    # a context per target), started once instead of once per target.
    worker_group: ClassVar[str | None] = None
    # True when the artifact is the ONNX variant itself: graph outputs added to it (the
    # intermediates matrix/assist/diagnose.py exposes) reach the runtime unchanged.
    runs_onnx_as_is: ClassVar[bool] = False
    # Runtime settings this target can vary (the settings grid); a knob it lacks is never run on it.
    knobs: ClassVar[dict[str, Knob]] = {}

    @abstractmethod
    def runtime_version(self) -> str: ...

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when the target can run here, else what a person should do about it."""

    def variant_skip_reason(self, variant: str) -> str | None:
        if variant in self.variants:
            return None
        return f"{self.name} has no {variant} variant"

    def prepare(self, ctx: PrepareContext, variant: str) -> Artifact:
        """Default: the core's ONNX variant as it is, with the time the core took to make it."""
        return Artifact(path=ctx.onnx_variant(variant), conversion_s=ctx.variant_seconds.get(variant, 0.0),
                        notes=list(ctx.variant_notes.get(variant, [])), variant=variant, cache_dir=ctx.cache_dir,
                        batch_axes=ctx.batch_axes)

    def open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        """A cell that cannot run on this host is a SKIP with the reason, checked here once for every target."""
        if reason := self.unavailable_reason():
            raise CellSkip(reason)
        return self._open(artifact, threads, settings)

    @abstractmethod
    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        """The target's session; called only where unavailable_reason() is None. `settings` holds values of
        this target's `knobs` only (checked by the core); {} means defaults."""

    def start_runtime(self, threads: int) -> None:
        """Start what the next session needs besides its model (a browser page, a helper process that
        has done its imports, a runtime initialised with the session's `threads`) before cold start is
        timed, so cold start stays session creation + first inference; called before each open(); the
        default starts nothing."""

    def emulated(self) -> bool:
        """Whether the device the next session runs on is emulated in software (asked after start_runtime):
        its timings mean nothing (BackendInfo.emulated) and never rank, so its cold start is not given the
        machine alone (matrix.run.worker); the default: a real device."""
        return False

    def stop_runtime(self) -> None:
        """Release what start_runtime started, when this target's worker moves on to another target's
        cells (Target.worker_group); the default has nothing to release."""

    def start_service(self, run_dir: Path) -> RunService | None:
        return None


def signal_name(number: int) -> str:
    """SIGKILL for 9: how a process that was killed is named in every message."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"
