"""Signed 8-bit weights on onnxruntime's x86-64 CPU kernels: the cause a drifting int8 cell can name, and its fix.

onnxruntime multiplies 8-bit activations by signed 8-bit weights (U8S8) with VPMADDUBSW on x86-64 CPUs
with AVX2/AVX-512 but no VNNI; its 16-bit pair sums saturate (onnxruntime's quantization guide, "When and
why do I need to try U8U8?": try reduce_range or U8U8; no such issue with VNNI or on ARM). Measured here
(AVX2, no VNNI) on the bundled MLP: dynamic QInt8 drifts 0.276 on ort-cpu at every graph optimization
level and on ort-node, tract 0.0036; QUInt8 1.5e-7, reduce_range 0.0045. Static QDQ (S8S8) drifts 0.299 at
opt=all and 1.2e-7 at opt=disable (the QDQ pairs then run unfused, in float); U8U8 or reduce_range 1.2e-7.

The same weights as uint8 with every zero point + 128 are the same numbers ((w + 128) - (zp + 128) = w - zp),
and onnxruntime then runs them through its U8U8 kernels: `to_unsigned` is that rewrite (--assist's
`u8-weights`), so a cell it makes PASS measures the cause.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..results import Cell

# op -> (the weight's input index, its zero point's index); the weight counts when it is an int8 initializer
WEIGHT_SLOTS = {"MatMulInteger": (1, 3), "ConvInteger": (1, 3), "QLinearMatMul": (3, 5), "QLinearConv": (3, 5),
                "DequantizeLinear": (0, 2)}
SATURATING_TARGETS = ("ort-cpu", "ort-node")  # onnxruntime's own CPU kernels on this host (measured on both)
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
GUIDE = ("requantize with weight_type=QuantType.QUInt8 (U8U8) or reduce_range=True (7-bit weights), as onnxruntime's "
         "quantization guide advises, or run it on a CPU with VNNI")


def signed_weights(proto: onnx.ModelProto) -> list[tuple[onnx.NodeProto, TensorProto, TensorProto | None]]:
    """(node, weight, zero point or None when absent) for each node whose weight is a signed 8-bit initializer
    and whose zero point, if any, is one too (a computed one cannot be shifted here)."""
    initializers = {tensor.name: tensor for tensor in proto.graph.initializer}
    found = []
    for node in proto.graph.node:
        slots = WEIGHT_SLOTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if slots is None or len(node.input) <= slots[0]:
            continue
        weight = initializers.get(node.input[slots[0]])
        zero_name = node.input[slots[1]] if len(node.input) > slots[1] else ""
        zero = initializers.get(zero_name) if zero_name else None
        if weight is None or weight.data_type != TensorProto.INT8 or (zero_name and (zero is None or zero.data_type != TensorProto.INT8)):
            continue
        found.append((node, weight, zero))
    return found


def to_unsigned(proto: onnx.ModelProto) -> list[str]:
    """Rewrite in place each signed weight as uint8 + 128 with its zero point + 128 (absent: 128, the shape of its
    scale); the names of the nodes changed. The old initializers stay for whatever else reads them."""
    graph, changed = proto.graph, []
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    for node, weight, zero in signed_weights(proto):
        weight_slot, zero_slot = WEIGHT_SLOTS[node.op_type]
        if zero is not None:
            zero_value = numpy_helper.to_array(zero)
        elif node.op_type == "DequantizeLinear":  # its zero point has the scale's shape
            if node.input[1] not in shapes:
                continue
            zero_value = np.zeros(shapes[node.input[1]], np.int8)
        else:
            zero_value = np.array(0, np.int8)
        base = node.name or node.output[0]
        node.input[weight_slot] = _add(graph, _shifted(numpy_helper.to_array(weight)), f"{weight.name}/uint8")
        while len(node.input) <= zero_slot:
            node.input.append("")
        node.input[zero_slot] = _add(graph, _shifted(zero_value), f"{base}/zero_point_uint8")
        changed.append(base)
    return changed


def _shifted(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.int16) + 128).astype(np.uint8)


def _add(graph: onnx.GraphProto, value: np.ndarray, name: str) -> str:
    graph.initializer.append(numpy_helper.from_array(value, name))
    return name


@functools.cache
def saturating_cpu() -> str:
    """'avx2, no avx512_vnni/avx_vnni' on an x86-64 CPU whose U8S8 kernels saturate; '' where they do not or
    where this cannot be read (not Linux)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    if not flags or flags & set(VNNI_FLAGS):
        return ""
    widest = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse4_1"
    return f"{widest}, no {'/'.join(VNNI_FLAGS)}"


def saturation_reason(cell: Cell, proto: onnx.ModelProto) -> str | None:
    """The cause line for a drifting cell of `proto` (the caller knows it drifts) on onnxruntime's CPU kernels,
    when the model has signed 8-bit weights and this CPU's U8S8 kernels saturate; None otherwise. --assist
    prepares the first model only: a candidate's line says to run it as the model."""
    if not cell.target.startswith(SATURATING_TARGETS):
        return None
    nodes = [node.name or node.output[0] for node, _, _ in signed_weights(proto)]
    cpu = saturating_cpu()
    if not nodes or not cpu:
        return None
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    return (f"cause: onnxruntime's x86-64 kernels for 8-bit activations x signed 8-bit weights (U8S8, VPMADDUBSW) "
            f"saturate on CPUs without VNNI, as this one ({cpu}), and this model's weights are signed int8 "
            f"(nodes: {shown}): {GUIDE} (--assist's u8-weights stores the same weights unsigned"
            f"{f', with {cell.candidate} as the model' if cell.candidate else ''})")
