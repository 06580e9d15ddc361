"""Operators the float64 reference evaluates itself, where onnx.reference's own is wrong or missing.

Each class follows onnx.reference's contract (an OpRun subclass named after the op, `_run` returns a
tuple) and is handed to every ReferenceEvaluator the tool builds (reference.evaluator). A verdict must be
the runtime's doing: a reference that crashes on a valid graph would leave a policy with no cells at all.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_25
from onnx.reference.ops.op_scatter_elements import ScatterElements


class GatherElements(OpRun):
    """onnx 1.23's GatherElements takes a negative axis as its cross-section index (`shape[:-1] +
    shape[0:]`) and refuses `axis=-1`, which torch writes for `gather(-1, ...)` (Stable-Baselines3's
    Categorical log_prob). The spec: the output has the indices' shape, `out[i][j] = data[i][idx[i][j]]`
    for axis 1, and `data` may be larger than the indices on the other axes."""

    def _run(self, data, indices, axis=None):
        axis = (axis or 0) % data.ndim
        window = tuple(slice(None) if d == axis else slice(0, size) for d, size in enumerate(indices.shape))
        wrapped = np.where(indices < 0, indices + data.shape[axis], indices)  # negative indices count from the end
        return (np.take_along_axis(data[window], wrapped.astype(np.int64), axis=axis),)


class DequantizeLinear(DequantizeLinear_25):
    """onnx 1.23 implements DequantizeLinear from opset 19 on only, so a model quantized at its own opset
    (ONNX Runtime's QDQ quantization of an opset-17 policy writes DequantizeLinear-13) had no reference. Opsets
    10 and 13 are the same arithmetic, `(x - zero_point) * scale` along `axis`; here it is done in float64,
    where onnx's own goes through float32, which rounds a QDQ bias (int32) above 2**24. Blocked and float8/4
    inputs (opset 21 on) stay onnx's own."""

    def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=None):
        if block_size or x.dtype.kind not in "iu":
            return super()._run(x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype)
        along_axis = [1] * x.ndim
        if x_scale.size > 1:  # per-axis scales and zero points
            along_axis[axis] = -1
        zero = 0.0 if x_zero_point is None else x_zero_point.astype(np.float64).reshape(along_axis)
        return (((x.astype(np.float64) - zero) * x_scale.reshape(along_axis)).astype(x_scale.dtype),)


class Scatter(ScatterElements):
    """Scatter (opsets 9-10, deprecated by ScatterElements-11, which is the same op) has no implementation in onnx
    1.23's evaluator: a model exported at opset 9 or 10 got no reference at all ("No registered implementation for
    operator 'Scatter'"), while ONNX Runtime runs it."""

    def _run(self, data, indices, updates, axis=None):
        return super()._run(data, indices, updates, axis=axis)


CORRECTED_OPS = [GatherElements, DequantizeLinear, Scatter]
