"""Validation of command-line values and matrix.toml: each bad value is one InputError
that names the option and what it accepts, before any work starts.

Small functions, one per kind of value, so every command (and config loading)
can reuse them.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .errors import InputError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE | re.ASCII)  # ASCII: see decide._AMOUNT
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def at_least(value: int, minimum: int, option: str) -> int:
    if value < minimum:
        raise InputError(f"{option} {value}: must be at least {minimum}")
    return value


MAX_SECONDS = 1e6  # about 11 days: beyond it a limit is no limit, and timers overflow
MAX_MEMORY_BYTES = 1 << 50  # 1 PiB: more than any host has; the kernel refuses limits past 2^64


def seconds(value: float, option: str) -> float:
    """A time limit: a finite number above zero, at most MAX_SECONDS."""
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise InputError(f"{option} {value}: must be a number of seconds above 0 and at most {MAX_SECONDS:.0f}")
    return value


def non_negative(value: float, option: str) -> float:
    if math.isnan(value) or value < 0:
        raise InputError(f"{option} {value}: must be a number >= 0")
    return value


def memory_size(value: str, option: str = "--memory-limit") -> int:
    """'4G', '512M', '1.5GiB' or plain bytes -> bytes (at least 64 MiB: less cannot even start Python)."""
    found = _SIZE.match(value)
    if not found:
        raise InputError(f"{option} {value!r}: expected a size such as 4G or 512M")
    size = int(float(found.group(1)) * _SCALE[found.group(2).lower()])
    if size < 64 << 20:
        raise InputError(f"{option} {value!r}: must be at least 64M")
    if size > MAX_MEMORY_BYTES:
        raise InputError(f"{option} {value!r}: must be at most 1024T")
    return size


def memory_text(nbytes: int) -> str:
    """Bytes said in --memory-limit's binary units, 3 significant digits: one way for a limit and what it is
    weighed against ('23.5 GiB'), wherever a cell, a refusal or a file's size names it."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{float(f'{nbytes / scale:.3g}'):g} {unit}"  # via float: .3g alone writes 1000 as 1e+03
    return f"{nbytes} bytes"


def default_memory_limit() -> int:
    """Physical memory, at least 4 GiB: a runaway cell fails alone instead of dragging the host into swap."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not every OS reports it
        physical = 0
    return max(physical, 4 << 30)


def tolerance_value(value: object, where: str) -> float:
    """A max-abs drift: a real number >= 0 (inf allowed: drift never fails). NaN would make every
    comparison false, so a FAIL would read as PASS: refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"{where}: tolerance {value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"{where}: tolerance {value!r} is not a number") from None
    if math.isnan(number) or number < 0:
        raise InputError(f"{where}: tolerance {value!r} must be a number >= 0")
    return number


def tolerance_key(key: str, targets: list[str], variants: tuple[str, ...], where: str) -> None:
    """TARGET:VARIANT, TARGET:*, *:VARIANT, or a bare target/variant: it must match some cell."""
    target, sep, variant = key.strip().partition(":")
    if not sep:
        if target in targets or target in variants:
            return
        raise InputError(f"{where}: {key!r} matches no target or variant; known: {', '.join([*targets, *variants])}")
    if target == "*" and variant == "*":
        raise InputError(f"{where}: '*:*' matches nothing (lookups try TARGET:VARIANT, TARGET:*, *:VARIANT); "
                         "set each variant, e.g. '*:fp32'")
    if target != "*" and target not in targets:
        raise InputError(f"{where}: {key!r} matches nothing: no target {target!r}; known: {', '.join(targets)}")
    if variant != "*" and variant not in variants:
        raise InputError(f"{where}: {key!r} matches nothing: no variant {variant!r}; known: {', '.join(variants)}")


MAX_CONFIG_BYTES = 16 << 20  # a matrix.toml or pyproject.toml is a few kB: far above any, far below harm


def read_toml(path: Path) -> dict:
    # here, not at the top: userfiles and validated import numpy and pydantic, which --version/--help never pay for;
    # tomllib costs the fork server, every worker and --version 10-20 ms of CPU each
    import tomllib

    from . import userfiles, validated

    try:
        with userfiles.open_regular(path, "config", MAX_CONFIG_BYTES) as stream:  # no FIFO, device or giant
            text = stream.read().decode("utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot read the config ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: cannot read the config (not UTF-8: byte {error.start})") from None

    try:
        return validated.check_nesting(tomllib.loads(text), f"{path}: cannot read the config")
    except tomllib.TOMLDecodeError as error:
        raise InputError(f"{path}: cannot read the config ({error})") from None
    except RecursionError:
        raise InputError(f"{path}: cannot read the config (nested deeper than {validated.MAX_NESTING} levels)") from None


def config_table(data: dict, name: str, path: Path) -> dict:
    """A [name] table of the config; `name = 5` at the top level is a mistake, not a table."""
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: {name!r} must be a table ([{name}] with KEY = VALUE lines), not {type(table).__name__}")
    return table


# The run options' defaults, defined once: the CLI shows them, RunConfig and CellSpec start from them.
DEFAULT_VARIANTS = ("fp32", "fp16", "int8")
DEFAULT_N_OBS = 128
DEFAULT_SEED = 0
DEFAULT_BATCH_SIZES = (1, 64)
DEFAULT_WARMUP = 20
DEFAULT_ITERS = 200
DEFAULT_THREADS = 1
DEFAULT_TIMEOUT_S = 600.0
