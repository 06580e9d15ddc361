"""The observation set every cell sees: recorded by the user, or seeded.

A seeded set is normal samples of the declared shape and dtype plus edge cases
(zeros, saturating magnitudes, tiny values) where runtimes tend to disagree.
The set is saved with the results so any run can be reproduced.

Only inputs that share the batch dimension of the first input are observations
to split into chunks; every other input (a side input such as `rng [1]`, a
scalar, a shape or axes tensor, a weight fed at run time) is fed whole to
every call.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import numpy as np

from targets.base import Feeds  # named arrays, inputs and outputs alike: one name across the code

from . import outdir, userfiles
from .errors import InputError
from .model import ModelInfo, TensorSpec

EDGE_VALUES = (0.0, 1.0, -1.0, 5.0, -5.0, 1e-6, 10.0, -10.0)


def batched_inputs(model: ModelInfo) -> list[str]:
    """Inputs that share the first input's batch dimension (the same symbol, or the same fixed size).

    With a fixed batch, an integer input beside a float one is a shape, axes or
    index tensor, not observations."""
    if not model.inputs or not model.inputs[0].shape or model.inputs[0].shape[0] == 0:
        return []
    primary = model.inputs[0]
    lead = primary.shape[0]

    def shares(spec: TensorSpec) -> bool:
        if not spec.shape:
            return False
        if not isinstance(lead, int):  # symbolic: the same name, or an unnamed dynamic dimension
            return not isinstance(spec.shape[0], int) and (spec.shape[0] == lead or None in (lead, spec.shape[0]))
        return spec.shape[0] == lead and np.dtype(spec.dtype).kind == np.dtype(primary.dtype).kind
    return [spec.name for spec in model.inputs if shares(spec)]


def whole_inputs(model: ModelInfo) -> list[str]:
    batched = set(batched_inputs(model))
    return [spec.name for spec in model.inputs if spec.name not in batched]


def batch_multiple(model: ModelInfo) -> int:
    """Observations must come in multiples of a fixed batch dimension, if the model has one."""
    lead = model.inputs[0].shape[0] if batched_inputs(model) else None
    return lead if isinstance(lead, int) else 1


def seeded(model: ModelInfo, count: int, seed: int) -> Feeds:
    rng = np.random.default_rng(seed)
    step = batch_multiple(model)
    count = max(step, count - count % step)
    batched = set(batched_inputs(model))
    return {spec.name: _sample(spec, count if spec.name in batched else None, rng) for spec in model.inputs}


def _sample(spec: TensorSpec, count: int | None, rng: np.random.Generator) -> np.ndarray:
    """`count` rows of the declared shape; None: one tensor of the declared shape (fed whole)."""
    rest = spec.shape[1:] if count is not None else spec.shape
    shape = (*([count] if count is not None else []), *[d if isinstance(d, int) else 1 for d in rest])
    count = shape[0] if shape else 1
    dtype = np.dtype(spec.dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu":
        high = 256 if dtype.itemsize == 1 else 16
        values = rng.integers(0, high, size=shape)
        if count >= 2:
            values[0], values[1] = 0, high - 1
        return values.astype(dtype)
    values = rng.standard_normal(size=shape)
    edges = min(len(EDGE_VALUES), count // 4)
    for row, value in enumerate(EDGE_VALUES[:edges]):
        values[row] = value
    return values.astype(dtype)


def load(path: Path, model: ModelInfo, limit_bytes: int | None = None) -> Feeds:
    """A user's recorded observations, checked before anything is allocated or unpickled (matrix.userfiles):
    of an .npz only the model's inputs are read."""
    path = Path(path)
    arrays = userfiles.read_arrays(path, "observation", limit_bytes, wanted=[spec.name for spec in model.inputs])
    if isinstance(arrays, np.ndarray):
        if len(model.inputs) != 1:
            raise InputError(f"{path}: a .npy holds one array but the model has {len(model.inputs)} inputs; use .npz")
        arrays = {model.inputs[0].name: arrays}
    feeds = {spec.name: _conform(spec, arrays, path) for spec in model.inputs}
    batched = set(batched_inputs(model))
    _check_rows({name: array for name, array in feeds.items() if name in batched}, path, batch_multiple(model))
    return feeds


def _conform(spec: TensorSpec, arrays: dict, path: Path) -> np.ndarray:
    if spec.name not in arrays:
        raise InputError(f"{path}: no array for model input {spec.name!r} (has {sorted(arrays)})")
    array = np.asarray(arrays[spec.name])
    expected = [d for d in spec.shape[1:]]
    fits = array.ndim == len(spec.shape) and all(not isinstance(e, int) or e == a for e, a in zip(expected, array.shape[1:]))
    if not fits:
        raise InputError(f"{path}: {spec.name!r} has shape {list(array.shape)}, the model expects [N, *{expected}]")
    return array.astype(spec.dtype, copy=False)


def _check_rows(feeds: Feeds, path: Path, step: int) -> None:
    """The inputs that share the batch dimension hold the same number of observations (side inputs are fed whole)."""
    rows = {name: len(array) for name, array in feeds.items()}
    if not rows:
        return
    if len(set(rows.values())) > 1:
        raise InputError(f"{path}: inputs hold different numbers of observations {rows}")
    total = next(iter(rows.values()))
    if total == 0:
        raise InputError(f"{path}: holds 0 observations")
    if total % step:
        raise InputError(f"{path}: holds {total} observations; the model's fixed batch {step} needs a multiple of it")


def save(feeds: Feeds, path: Path) -> None:
    """Written whole or not at all: a run killed while saving leaves no half file behind."""
    outdir.write_atomic_with(path, lambda stream: np.savez(stream, **feeds))


def read(path: Path) -> Feeds:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def count(feeds: Feeds, whole: Collection[str] = ()) -> int:
    """Number of observations: rows of the batched inputs (1 when every input is fed whole)."""
    batched = [array for name, array in feeds.items() if name not in whole and array.ndim]
    return len(batched[0]) if batched else 1


def take(feeds: Feeds, batch: int, whole: Collection[str] = ()) -> Feeds:
    """The first `batch` observations, tiled when the set is smaller; inputs in `whole` as they are."""
    index = np.arange(batch) % max(count(feeds, whole), 1)
    return {name: array if name in whole else np.ascontiguousarray(array[index]) for name, array in feeds.items()}


def run_in_batches(run, feeds: Feeds, batch: int, whole: Collection[str] = ()) -> Feeds:
    """Run the whole set in chunks of `batch` (0 = all at once) and concatenate outputs.

    Inputs in `whole` go to every chunk unsliced. When every input is fed whole
    there is one call and its outputs are returned as they are."""
    total = count(feeds, whole)
    if all(name in whole or not array.ndim for name, array in feeds.items()):
        return run(feeds)
    size = batch or total
    chunks = [
        run({n: a if n in whole else a[i : i + size] for n, a in feeds.items()}) for i in range(0, total, max(size, 1))
    ]
    if len(chunks) == 1:
        return chunks[0]
    return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}
