"""Operators the float64 reference evaluates itself, where onnx.reference's own is wrong.

Each class follows onnx.reference's contract (an OpRun subclass named after the op, `_run` returns a
tuple) and is handed to every ReferenceEvaluator the tool builds (reference.evaluator). A verdict must be
the runtime's doing: a reference that crashes on a valid graph would leave a policy with no cells at all.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


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


CORRECTED_OPS = [GatherElements]
