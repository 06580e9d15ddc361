"""TFLite / LiteRT: onnx2tf converts the policy, the LiteRT interpreter runs it.

This module holds the targets; the work is split by concern:
  tflite_conversion.py  onnx2tf in its own environment, the conversion cache
  tflite_flatbuffer.py  what a .tflite file holds (op counts, quantization, notes)
  tflite_session.py     the LiteRT interpreter (the only user of its private API)
  tflite_provenance.py  which ONNX node each LiteRT op came from, and where it ran (pure)
Running needs only `ai-edge-litert` in the main environment.

Variants (all converted from the fp32 ONNX model; onnx2tf makes its own
reduced-precision files rather than translating the ORT ones):
  fp32  onnx2tf float32 file
  fp16  onnx2tf float16 file: fp16 weights, dequantized at load, float32 I/O
  int8  dynamic-range quantization: int8 weights, float activations
The `tflite-int8-full` target has only int8: full integer quantization
(int8 weights and activations, float32 I/O) calibrated on the run's
observation set.

Two interpreter configurations are separate targets so the report shows
whether the XNNPACK delegate changes numbers or speed: `tflite` (LiteRT's
default, XNNPACK) and `tflite-noxnn` (builtin kernels only).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import ClassVar

from . import isolated_env
from .base import NO_SETTINGS, Artifact, Knob, PrepareContext, Session, Settings, Target
# build_environment: `policy-matrix setup tflite` builds the onnx2tf environment through this module.
from .tflite_conversion import (  # noqa: F401
    CACHED_WORDS, ENV_NAME, REQUIREMENTS, build_environment, converted, converter_pin, onnx_interface,
)
from .tflite_flatbuffer import flex_notes, layout_notes, op_inventory, quantization, variant_notes
from .tflite_provenance import Provenance
from .tflite_session import TfliteArtifact, TfliteSession, output_steps
from .versions import PipRelease

# Pinned LiteRT releases (`tflite@2.2.0`), measured on the bundled MLP: 1.0.0 has no schema_py_generated
# (the op inventory reads it), 1.1.0's Interpreter does not start here ("no attribute '_interpreter'").
LITERT_FLOOR = "1.2.0"
LITERT_FLOOR_WHY = "1.0 lacks schema_py_generated and 1.1's Interpreter does not start beside this project's packages"


def litert_version() -> str | None:
    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return None


class TfliteTarget(Target):
    name = "tflite"
    summary = "onnx2tf -> LiteRT interpreter, XNNPACK delegate (LiteRT's default)"
    xnnpack: ClassVar[bool] = True
    # Which conversion produces this target's files: "dynamic" (fp32/fp16/int8 dynamic-range)
    # or "full" (full-integer int8 calibrated on the observation set).
    recipe: ClassVar[str] = "dynamic"
    # `tflite@2.2.0` runs another LiteRT on the same converted file (targets/versions.py)
    release = PipRelease("ai-edge-litert", floor=LITERT_FLOOR, why_floor=LITERT_FLOOR_WHY)
    knobs = {
        "threads": Knob("Interpreter(num_threads=...) (default: --threads)"),
        # The same switch as the tflite-noxnn target, as a grid axis of this one (tflite-noxnn stays a
        # target of its own: earlier results and --targets globs name it).
        "xnnpack": Knob("XNNPACK delegate on (LiteRT's default) or off (builtin kernels only)", ("on", "off"), default="on"),
    }

    def runtime_version(self) -> str:
        return f"ai-edge-litert {litert_version() or 'missing'} ({converter_pin()})"

    def unavailable_reason(self) -> str | None:
        if litert_version() is None:
            return "ai-edge-litert is not installed: run `policy-matrix setup tflite`"
        if isolated_env.env_python(ENV_NAME, REQUIREMENTS) is None:
            if not sys.platform.startswith("linux"):
                return "the onnx2tf conversion environment installs on Linux only (its ai-edge-litert==2.1.0 pin has no wheel here)"
            return "needs setup: run `policy-matrix setup tflite` (builds the onnx2tf environment once, about 2.6 GB, ~2 min)"
        return None

    def prepare(self, ctx: PrepareContext, variant: str) -> Artifact:
        model = ctx.onnx_variant("fp32")  # onnx2tf makes its own fp16/int8 files from fp32
        entry, fresh = converted(ctx, model, self.recipe)
        meta = json.loads((entry / "meta.json").read_text())
        file_variant = variant if self.recipe == "dynamic" else "int8-full"
        if file_variant in meta.get("missing", {}):  # this cell only: its siblings have their files
            raise RuntimeError(meta["missing"][file_variant] + ("" if fresh else CACHED_WORDS))
        path = entry / f"{file_variant}.tflite"
        interface = onnx_interface(model)
        artifact = TfliteArtifact(
            path=path,
            conversion_s=meta["seconds"],
            op_inventory=op_inventory(path.read_bytes()),
            quantization=quantization(path.read_bytes()) if variant == "int8" else None,
            notes=[f"converted by {meta['converter']}" + ("" if fresh else " (cached)")],
            variant=variant,
            cache_dir=ctx.cache_dir,
            provenance=Provenance.from_converter(interface, meta["layers"]),
        )
        artifact.notes += variant_notes(variant, self.recipe, artifact.quantization) + layout_notes(interface, artifact.op_inventory)
        artifact.notes += flex_notes(artifact.op_inventory)
        if self.recipe == "full":
            artifact.output_steps = output_steps(artifact)
        return artifact

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        xnnpack = settings.get("xnnpack", "on" if self.xnnpack else "off") == "on"
        return TfliteSession(artifact, int(settings.get("threads", threads)), xnnpack)


class TfliteNoXnnpack(TfliteTarget):
    name = "tflite-noxnn"
    summary = "onnx2tf -> LiteRT interpreter, builtin kernels only (XNNPACK delegate off)"
    xnnpack = False
    knobs = {"threads": TfliteTarget.knobs["threads"]}  # XNNPACK is off by definition here


class TfliteInt8Full(TfliteTarget):
    name = "tflite-int8-full"
    summary = "onnx2tf full-integer int8 (calibrated on the observation set) -> LiteRT, XNNPACK"
    variants = ("int8",)
    recipe = "full"
