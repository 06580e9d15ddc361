"""Contract differences between a training framework and its exported graph, named by fitting.

When the source's actions differ from the ONNX graph's float64 reference, a few transforms
explain most real cases: SB3's SAC/TD3 `predict` rescales the tanh output [-1, 1] to the
action space and its PPO clips to it, while the documented exports end before either;
VecNormalize's observation statistics are applied outside the policy; CNN policies divide
pixels by 255 inside `predict`'s preprocessing. Each transform is applied to the paired
outputs (or, for observation transforms, to the observations the reference was evaluated
on) and kept when it closes the gap to within the tolerance: the report names what the
numbers show, never what a name suggests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NORMALIZE = "normalize"  # the reference on observations normalised with the source's statistics
DIVIDE_255 = "divide255"  # the reference on observations / 255 (every float input)
OBSERVATION_TRANSFORMS = {
    NORMALIZE: "the source normalises observations with its statistics (--source-normalize); the ONNX graph does not",
    DIVIDE_255: "the source divides observations by 255; the ONNX graph does not",
}
AFFINE_IDENTITY = 1e-6  # a fitted scale/offset this close to 1/0 is no rescale at all


def divide_255_key(name: str) -> str:
    """The transform that divides one input of several by 255 (a Dict observation's image key)."""
    return f"{DIVIDE_255}:{name}"


@dataclass
class Bounds:
    low: np.ndarray
    high: np.ndarray

    def text(self, values: np.ndarray) -> str:
        flat = np.unique(values)
        return f"{flat[0]:g}" if flat.size == 1 else "[" + ", ".join(f"{v:g}" for v in values.reshape(-1)) + "]"

    def describe(self) -> str:
        return f"[{self.text(self.low)}, {self.text(self.high)}]"


@dataclass
class Explanation:
    transform: str  # clip | rescale | onnx-clips | onnx-rescales | affine | normalize | divide255 (all or one input)
    text: str  # the sentence the report shows
    residual: float  # max |source - transformed reference| that remains


def rescale(values: np.ndarray, bounds: Bounds) -> np.ndarray:
    """SB3's unscale_action: [-1, 1] -> [low, high]."""
    return bounds.low + (values + 1.0) * 0.5 * (bounds.high - bounds.low)


def _residual(source: np.ndarray, candidate: np.ndarray) -> float:
    return float(np.max(np.abs(source - candidate), initial=0.0))


def explain(source: np.ndarray, reference: np.ndarray, tolerance: float, bounds: Bounds | None = None,
            transformed: dict[str, np.ndarray] | None = None) -> Explanation | None:
    """The one transform that makes `reference` (rows x action dims, float64) equal `source` within
    `tolerance`, the closest if several do; None when the outputs already agree or nothing explains them."""
    source, reference = np.asarray(source, np.float64), np.asarray(reference, np.float64)
    if source.shape != reference.shape or _residual(source, reference) <= tolerance:
        return None
    found = [*_action_transforms(source, reference, bounds), *_observation_transforms(source, transformed or {})]
    fitting = [e for e in found if e.residual <= tolerance]
    return min(fitting, key=lambda e: e.residual) if fitting else None


def _action_transforms(source: np.ndarray, reference: np.ndarray, bounds: Bounds | None) -> list[Explanation]:
    if bounds is None:
        return [e for e in [_affine(source, reference)] if e is not None]
    space = bounds.describe()
    return [
        Explanation("clip", f"the source clips actions to the action space {space}; the ONNX graph does not",
                    _residual(source, np.clip(reference, bounds.low, bounds.high))),
        Explanation("rescale", f"the source rescales [-1, 1] to the action space {space}; the ONNX graph does not",
                    _residual(source, rescale(reference, bounds))),
        Explanation("onnx-clips", f"the ONNX graph clips actions to {space}; the source does not",
                    _residual(np.clip(source, bounds.low, bounds.high), reference)),
        Explanation("onnx-rescales", f"the ONNX graph rescales [-1, 1] to {space}; the source does not",
                    _residual(rescale(source, bounds), reference)),
    ]


def _affine(source: np.ndarray, reference: np.ndarray) -> Explanation | None:
    """Without an action space: per action dimension, source = scale * reference + offset by least squares."""
    rows = len(source)
    flat_source, flat_reference = source.reshape(rows, -1), reference.reshape(rows, -1)
    scales, offsets = [], []
    for column in range(flat_source.shape[1]):
        design = np.stack([flat_reference[:, column], np.ones(rows)], axis=1)
        (scale, offset), *_ = np.linalg.lstsq(design, flat_source[:, column], rcond=None)
        scales.append(scale)
        offsets.append(offset)
    scales, offsets = np.array(scales), np.array(offsets)
    if np.allclose(scales, 1.0, atol=AFFINE_IDENTITY) and np.allclose(offsets, 0.0, atol=AFFINE_IDENTITY):
        return None
    fitted = (flat_reference * scales + offsets).reshape(source.shape)
    text = (f"the source scales the ONNX output affinely (x {_list(scales)} + {_list(offsets)}); "
            "the ONNX graph does not (no action space known to name it: pass --env)")
    return Explanation("affine", text, _residual(source, fitted))


def _list(values: np.ndarray) -> str:
    return f"{values[0]:.4g}" if values.size == 1 else "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _observation_transforms(source: np.ndarray, transformed: dict[str, np.ndarray]) -> list[Explanation]:
    return [_observation_explanation(name, _residual(source, np.asarray(outputs, np.float64)))
            for name, outputs in transformed.items() if np.shape(outputs) == source.shape]


def _observation_explanation(transform: str, residual: float) -> Explanation:
    kind, _, key = transform.partition(":")
    text = f"the source divides the observation {key!r} by 255; the ONNX graph does not" if key else \
        OBSERVATION_TRANSFORMS[kind]
    return Explanation(kind, text, residual)
