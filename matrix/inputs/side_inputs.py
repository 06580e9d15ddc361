"""`--side-input NAME=VALUE`: the value of an input fed whole beside the observation.

A side input has no batch axis (batch_axes.py): a rank-0 `deterministic` flag as torch.onnx.export writes
SB3-style actors, `rng [1]`, silero-vad's rank-0 `sr`. Its value is the user's to say, not the tool's to
guess: given, it replaces the seeded value in the observation set (so the parity rows are judged with it),
must agree with a recorded `--obs` file that holds the input too, and is fed on every step of every
episode (`--env`, `--trajectory`) to the float64 reference, every cell and the `--source` column alike.
Without it, a seeded set feeds random values, and rollouts refuse to guess.

Imported only when a side input is given: a plain run never pays for it.
"""

from __future__ import annotations

import json

import numpy as np

from .. import validated
from ..errors import InputError
from .model import ModelInfo, TensorSpec

OPTION = "--side-input"
EXAMPLE = f"{OPTION} deterministic=true, {OPTION} rng=[0.5]"

Given = dict[str, object]  # NAME -> the parsed JSON value, before the model is read


def parse(specs: tuple[str, ...] | list[str]) -> Given:
    """NAME=VALUE per option, VALUE JSON (a number, true/false, or nested lists of them); each name once."""
    given: Given = {}
    for spec in specs:
        name, sep, text = spec.rpartition("=")  # JSON values hold no '=': a name may
        if not sep or not name or not text.strip():
            raise InputError(f"{OPTION} {spec[:100]!r}: expected NAME=VALUE, e.g. {EXAMPLE}")
        if name in given:
            raise InputError(f"{OPTION} {name[:100]!r} is given twice: one value per input")
        given[name] = validated.json_value(text, f"{OPTION} {name[:100]!r}")
    return given


def conform(given: Given, model: ModelInfo, given_by: str = OPTION) -> dict[str, np.ndarray]:
    """Each value as its input takes it: the declared dtype and shape; InputError naming the input and what it expects,
    after `given_by`, where the values come from (the option, or a trajectory's `PATH:` that recorded them)."""
    specs = {spec.name: spec for spec in model.inputs}
    return {name: _conformed(name, value, specs, model, given_by) for name, value in given.items()}


def _conformed(name: str, value: object, specs: dict[str, TensorSpec], model: ModelInfo, given_by: str) -> np.ndarray:
    spec = specs.get(name)
    whole = [n for n in specs if n not in model.batch_axes]
    if spec is None:
        these = f"its inputs fed whole are {whole}" if whole else "every input it has carries the batch"
        raise InputError(f"{given_by} {name[:100]!r}: the model has no such input; {these}")
    if name in {pair.input for pair in model.state_pairs}:
        raise InputError(f"{given_by} {name!r}: a recurrent state input, carried from step to step (--initial-state starts it)")
    if name in model.batch_axes:
        raise InputError(f"{given_by} {name!r}: this input carries the batch (axis {model.batch_axes[name]}), one value per "
                         f"observation; a side input is fed whole (--batch-axis {name}=-1 says it is one)")
    expects = f"input {name!r} is {spec.dtype} {_shape_words(spec.shape)}"
    said = f"{given_by} {name!r}"
    array = _numbers(value, said, expects)
    if not _fits(array.shape, spec.shape):
        raise InputError(f"{said}: a value of shape {list(array.shape)}; {expects}")
    if array.ndim != len(spec.shape):  # one number for a one-element input, `rng=0.5` for `rng [1]`
        array = array.reshape([1] * len(spec.shape))
    return _cast(array, np.dtype(spec.dtype), said, expects)


def _numbers(value: object, said: str, expects: str) -> np.ndarray:
    """The JSON value as an array of numbers or booleans (no strings, nulls, objects or ragged lists)."""
    try:
        array = np.asarray(value) if _numbers_only(value) else None
        if array is not None and array.dtype == object:  # an integer beyond 64 bits: a number _cast then refuses
            array = np.asarray(value, dtype=np.float64)
    except ValueError:  # ragged nested lists
        array = None
    if array is None or array.dtype.kind not in "biuf":
        raise InputError(f"{said}: expected a JSON number, true/false or nested lists of them "
                         f"(got {json.dumps(value)[:60]}); {expects}")
    return array


def _numbers_only(value: object) -> bool:
    """Whether every leaf of the JSON value is a number or true/false (validated.json_value bounds the nesting)."""
    if isinstance(value, list):
        return all(_numbers_only(item) for item in value)
    return isinstance(value, (int, float))


def _fits(shape: tuple[int, ...], declared: list) -> bool:
    """The declared shape, a symbolic dim taking any size; or one number where the input holds one element."""
    if len(shape) == len(declared):
        return all(not isinstance(d, int) or d == n for d, n in zip(declared, shape))
    return not shape and all(not isinstance(d, int) or d == 1 for d in declared)


def _cast(array: np.ndarray, dtype: np.dtype, said: str, expects: str) -> np.ndarray:
    """Cast to the input's dtype, refusing what it cannot hold (2 for a flag, 0.5 for an integer, 300 for a uint8,
    a non-finite float): a silently changed value would judge the matrix on another input than the one said."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InputError(f"{said}: holds a non-finite value; {expects}")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype)
    if dtype.kind in "biu" and not np.array_equal(cast.astype(np.float64), array.astype(np.float64)):
        wanted = "true/false (or 1/0)" if dtype.kind == "b" else f"whole numbers a {dtype} holds"
        raise InputError(f"{said}: expected {wanted}; {expects}")
    if dtype.kind == "f" and not np.isfinite(cast).all():
        raise InputError(f"{said}: beyond what a {dtype} holds; {expects}")
    return cast


def _shape_words(shape: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]" + (" (one value)" if not shape else "")
