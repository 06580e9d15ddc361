"""The observation set every cell sees: recorded by the user, or seeded.

A seeded set is normal samples of the declared shape and dtype plus edge cases
(zeros, saturating magnitudes, tiny values) where runtimes tend to disagree; an
8-bit integer input, and a float input its graph divides by 255 first (pixels,
graph_facts.pixel_inputs), get whole numbers in [0, 255] instead, the ends first;
an integer input its graph looks up in a table (an Embedding's Gather, a OneHot:
graph_facts.index_inputs) gets the table's indices, other integers [0, 15].
The set is saved with the results so any run can be reproduced.

Each input is split into chunks along its own batch axis (batch_axes.py: axis 0
of the observation, axis 1 of an LSTM state `[layers, batch, hidden]`, ...);
an input without one (a side input such as `rng [1]`, a rank-0 scalar, a shape
or axes tensor, a weight fed at run time) is fed whole to every call. Saved
and recorded arrays keep the model's own layout: the batch on its axis.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from targets.base import Feeds  # named arrays, inputs and outputs alike: one name across the code
from targets.base import head  # noqa: F401 (the first observations along each batch axis: targets need it too)

from .. import outdir, userfiles
from .batch_axes import BatchAxes, batch_dim
from .graph_facts import index_inputs, pixel_inputs
from ..errors import InputError, interrupts_held
from .model import ModelInfo, TensorSpec

EDGE_VALUES = (0.0, 1.0, -1.0, 5.0, -5.0, 1e-6, 10.0, -10.0)
PIXEL_LEVELS = 256  # 8-bit values: a uint8 input's whole range, and the pixels a graph divides by 255


def batch_multiple(model: ModelInfo) -> int:
    """Observations must come in multiples of a fixed batch dimension, if the model has one."""
    lead = batch_dim(model.inputs[0], model.batch_axes)
    return lead if isinstance(lead, int) and lead > 0 else 1


def seeded(model: ModelInfo, count: int, seed: int) -> Feeds:
    rng = np.random.default_rng(seed)
    step = batch_multiple(model)
    count = max(step, count - count % step)
    levels = {name: whole_numbers for name, (whole_numbers, _) in _whole_number_inputs(model).items()}
    return {spec.name: _sample(spec, count, model.batch_axes.get(spec.name), rng, levels.get(spec.name))
            for spec in model.inputs}


def _whole_number_inputs(model: ModelInfo) -> dict[str, tuple[int, str]]:
    """The inputs seeded with whole numbers from 0 because their graph says so (pixels, table indices) -> (how many,
    why in words)."""
    return {**{name: (PIXEL_LEVELS, f"the pixels its graph scales first ({op})") for name, op in pixel_inputs(model.proto).items()},
            **index_inputs(model.proto)}


def whole_numbers_said(model: ModelInfo) -> str:
    """Those inputs in words, for the observation source's line ("" when none)."""
    return "; ".join(f"{name!r}: whole numbers in [0, {levels - 1}], {why}"
                     for name, (levels, why) in _whole_number_inputs(model).items())


def _sample(spec: TensorSpec, count: int, axis: int | None, rng: np.random.Generator, levels: int | None) -> np.ndarray:
    """`count` observations of the declared shape along the batch axis; without one (axis None), one
    tensor of the declared shape (fed whole). An open dim other than the batch is 1."""
    rest = [d if isinstance(d, int) else 1 for i, d in enumerate(spec.shape) if i != axis]
    rows = _values(spec, [count, *rest] if axis is not None else rest, rng, levels)
    return np.ascontiguousarray(np.moveaxis(rows, 0, axis)) if axis is not None else rows


def _values(spec: TensorSpec, shape: list[int], rng: np.random.Generator, levels: int | None) -> np.ndarray:
    """Normal samples, the first rows set to edge values; integers, and inputs given `levels`: whole numbers, the
    first rows the range's ends."""
    count = shape[0] if shape else 1
    dtype = np.dtype(spec.dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu" or levels:
        high = levels or (PIXEL_LEVELS if dtype.itemsize == 1 else 16)
        values = rng.integers(0, high, size=shape)
        if count >= 2:
            values[0], values[1] = 0, high - 1
        return values.astype(dtype)
    values = rng.standard_normal(size=shape)
    edges = min(len(EDGE_VALUES), count // 4)
    for row, value in enumerate(EDGE_VALUES[:edges]):
        values[row] = value
    return values.astype(dtype)


def load(path: Path, model: ModelInfo, limit_bytes: int | None = None, side: Feeds | None = None) -> Feeds:
    """A user's recorded observations, checked before anything is allocated or unpickled (matrix.userfiles):
    of an .npz only the model's inputs are read. A side input given a value (`side`, --side-input) need not be
    in the file; where it is, it must hold that value."""
    path, side = Path(path), side or {}
    arrays = userfiles.read_arrays(path, "observation", limit_bytes, wanted=[spec.name for spec in model.inputs])
    if isinstance(arrays, np.ndarray):
        recorded = [spec.name for spec in model.inputs if spec.name not in side]
        if len(recorded) != 1:
            raise InputError(f"{path}: a .npy holds one array but the model has {len(model.inputs)} inputs; use .npz")
        arrays = {recorded[0]: arrays}
    axes = model.batch_axes
    feeds = {spec.name: _conform(spec, axes.get(spec.name), arrays, path, model.is_policy)
             for spec in model.inputs if spec.name in arrays or spec.name not in side}
    check_side(feeds, side, path)
    feeds = {spec.name: feeds[spec.name] if spec.name in feeds else side[spec.name] for spec in model.inputs}
    rows = {name: array.shape[axes[name]] for name, array in feeds.items() if name in axes}
    _check_rows(rows, path, batch_multiple(model), axes)
    return feeds


def _conform(spec: TensorSpec, axis: int | None, arrays: dict, path: Path, finite: bool) -> np.ndarray:
    """The array as declared, with any number of observations N along the batch axis; `finite` for a policy's."""
    if spec.name not in arrays:
        raise InputError(f"{path}: no array for model input {spec.name!r} (has {sorted(arrays)})")
    array = np.asarray(arrays[spec.name])
    expected = ["N" if i == axis else d for i, d in enumerate(spec.shape)]
    fits = array.ndim == len(spec.shape) and all(not isinstance(e, int) or e == a for e, a in zip(expected, array.shape))
    if not fits:
        words = ", ".join("?" if dim is None else str(dim) for dim in expected)
        raise InputError(f"{path}: {spec.name!r} has shape {list(array.shape)}, the model expects [{words}] (N observations)")
    if not finite:  # a model that is no policy (an ONNX node test's Cast) may be fed NaN and inf: the reference too
        return array.astype(spec.dtype, copy=False)
    _check_finite(array, spec, axis, path)  # before the cast too: a NaN cast to an integer input is a number
    with np.errstate(over="ignore", invalid="ignore"):  # a value beyond the input's dtype: refused below
        cast = array.astype(spec.dtype, copy=False)
    _check_finite(cast, spec, axis, path)
    check_held(array, cast, spec.name, axis, path)
    return cast


def given_words(values: Feeds) -> str:
    """`deterministic = true, rng = [0.5]`: side inputs' values as --side-input takes them (JSON)."""
    return ", ".join(f"{name} = {json.dumps(value.tolist())}" for name, value in values.items())


def check_side(recorded: Feeds, side: Feeds, path: Path) -> None:
    """Two values for one side input (the file's and --side-input's) is a mistake to say, not one to choose between.
    The file may hold the value once or once per recorded step (a trajectory of stacked feeds)."""
    for name, value in side.items():
        if name in recorded and not holds_only(recorded[name], value):
            shown, given = (json.dumps(array.tolist())[:80] for array in (recorded[name], value))  # as the option takes it
            raise InputError(f"{path}: holds {name!r} = {shown}, but --side-input gives {given}: give one "
                             "(leave it out of the file, or the option out)")


def holds_only(recorded: np.ndarray, value: np.ndarray) -> bool:
    """Whether `recorded` is `value`, once or repeated (compared as numbers: a recorded 1.0 is a given true)."""
    if value.size == 0 or recorded.size == 0 or recorded.size % value.size:
        return recorded.shape == value.shape
    return bool(np.all(recorded.reshape(-1, *value.shape) == value))


def check_held(recorded: np.ndarray, cast: np.ndarray, name: str, axis: int | None, path: Path) -> None:
    """An integer input holds whole numbers in its range: [0, 1] floats for uint8 pixels (SB3's CnnPolicy divides
    by 255 inside) would all become 0, and 300 would become 44, silently."""
    if cast.dtype.kind not in "iub" or cast.dtype == recorded.dtype:
        return
    with np.errstate(invalid="ignore"):
        changed = np.argwhere(cast.astype(recorded.dtype) != recorded)
    if len(changed):  # not .size: a rank-0 array's one hit is a row of no coordinates
        at = tuple(changed[0])
        where = f" at row {at[axis]}" if axis is not None else ""
        raise InputError(f"{path}: {name!r} holds {recorded[at]:g}{where}, which a {cast.dtype} input cannot hold: "
                         "record observations as the policy receives them")


def first_non_finite(array: np.ndarray) -> tuple[int, ...] | None:
    """Where the first NaN or infinity of a float array is (None: all finite, or no floats)."""
    if array.dtype.kind != "f":
        return None
    bad = np.argwhere(~np.isfinite(array))
    return tuple(int(i) for i in bad[0]) if len(bad) else None  # a rank-0 array's hit has no coordinates: not .size


def _check_finite(array: np.ndarray, spec: TensorSpec, axis: int | None, path: Path) -> None:
    """A NaN or an infinity in a policy's recorded observation is no state: every cell would FAIL 'finite outputs'
    on the action it makes (which must be finite), the runtime blamed for the file."""
    bad = first_non_finite(array)
    if bad is not None:
        where = f" at row {bad[axis]}" if axis is not None else ""
        raise InputError(f"{path}: {spec.name!r} holds a non-finite value{where} (as {array.dtype}): observations "
                         "must be finite")


def _check_rows(rows: dict[str, int], path: Path, step: int, axes: dict[str, int]) -> None:
    """The inputs that carry the batch hold the same number of observations (the others are fed whole)."""
    if not rows:
        return
    if len(set(rows.values())) > 1:
        counted = ", ".join(f"{name!r}: {count} on axis {axes[name]}" for name, count in rows.items())
        raise InputError(f"{path}: inputs hold different numbers of observations ({counted}); where an axis is not the "
                         "batch, --batch-axis NAME=AXIS names it (-1: the input is fed whole)")
    total = next(iter(rows.values()))
    if total == 0:
        raise InputError(f"{path}: holds 0 observations")
    if total % step:
        raise InputError(f"{path}: holds {total} observations; the model's fixed batch {step} needs a multiple of it")


def save(feeds: Feeds, path: Path) -> None:
    """An .npz numpy reads, written whole or not at all (a run killed while saving leaves no half file behind).
    Every name is the model's, kept as it is: written as np.savez writes, one `NAME.npy` member each, but not
    through its keyword arguments, which take an input named `file` or `allow_pickle` for their own."""
    def write(stream) -> None:
        with zipfile.ZipFile(stream, "w", allowZip64=True) as archive:
            for name, array in feeds.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)

    with interrupts_held():
        outdir.write_atomic_with(path, write)


def read(path: Path) -> Feeds:
    """What `save` wrote, each array by its member's exact name: np.load's `data["a.npy"]` reads the member of an
    array named `a` when both `a` and `a.npy` are there."""
    with zipfile.ZipFile(path) as archive:
        return {member.filename.removesuffix(".npy"): _member(archive, member) for member in archive.infolist()}


def _member(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> np.ndarray:
    with archive.open(member) as stream:
        return np.lib.format.read_array(stream, allow_pickle=False)


def count(feeds: Feeds, axes: BatchAxes) -> int:
    """Number of observations: the batch of the inputs that carry one (1 when every input is fed whole)."""
    sizes = [array.shape[axes[name]] for name, array in feeds.items() if name in axes]
    return sizes[0] if sizes else 1


def take(feeds: Feeds, batch: int, axes: BatchAxes) -> Feeds:
    """The first `batch` observations along each input's batch axis, tiled when the set is smaller;
    inputs without a batch axis as they are."""
    index = np.arange(batch) % max(count(feeds, axes), 1)
    return {name: np.ascontiguousarray(np.take(array, index, axis=axes[name])) if name in axes else array
            for name, array in feeds.items()}


def _slice(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    return array[(slice(None),) * axis + (slice(start, stop),)]


def run_in_batches(run, feeds: Feeds, batch: int, axes: BatchAxes) -> Feeds:
    """Run the whole set in chunks of `batch` (0 = all at once) along each input's batch axis and
    join the outputs along theirs (`axes` holds both).

    Inputs without a batch axis go to every chunk unsliced. When every input is fed whole
    there is one call and its outputs are returned as they are."""
    total = count(feeds, axes)
    if not any(name in axes for name in feeds):
        return run(feeds)
    size = max(batch or total, 1)
    chunks = [
        run({n: _slice(a, axes[n], i, i + size) if n in axes else a for n, a in feeds.items()}) for i in range(0, total, size)
    ]
    if len(chunks) == 1:
        return chunks[0]
    return {name: np.concatenate([chunk[name] for chunk in chunks], axis=axes.get(name, 0)) for name in chunks[0]}
