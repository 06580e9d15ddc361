"""Bounded reads of the user's files: the runner reads them itself, before any worker's limit applies.

Every file is opened once, without blocking (a FIFO must not hang the runner), and checked on the
open descriptor: a regular file only (no FIFO, device such as /dev/zero behind a symlink, or folder),
no larger than the run's memory cap. Hashing streams in chunks; arrays are read only after their
.npy headers (dtype, shape, declared size against the bytes present and the cap) have been checked,
and from an .npz only the members asked for, so an archive of unused giants costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import zipfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .errors import InputError
from .options import memory_text

MAX_NPZ_MEMBERS = 1024  # named arrays in one .npz; a model has far fewer inputs
MAX_NPY_HEADER = 10_000  # bytes of one .npy header (numpy's own default limit)


@contextlib.contextmanager
def open_regular(path: Path, what: str, limit_bytes: int | None = None) -> Iterator[BinaryIO]:
    """`path` opened for reading, once it is known to be a regular file within `limit_bytes`.
    `what` names the file in messages: "observation", "model", ..."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what} file") from None
    except OSError as error:
        raise InputError(f"{path}: cannot open the {what} file ({error.strerror or error})") from None
    except ValueError:  # a NUL in the path
        raise InputError(f"{one_line(repr(str(path)), 200)}: not a file name") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: the {what} file is {_kind(info.st_mode)}, not a regular file: refused")
        if limit_bytes is not None and info.st_size > limit_bytes:
            raise InputError(f"{path}: the {what} file is {memory_text(info.st_size)}, above the memory limit "
                             f"{memory_text(limit_bytes)}")
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as stream:
        yield stream


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_regular(path: Path, what: str, limit_bytes: int | None = None) -> None:
    with open_regular(path, what, limit_bytes):
        pass


def sha256(path: Path, what: str) -> str:
    """The file's hash, read in chunks: memory stays flat whatever its size."""
    with open_regular(path, what) as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def read_arrays(path: Path, what: str, limit_bytes: int | None, wanted: Collection[str] | None = None):
    """One ndarray (.npy), or {name: ndarray} of the `wanted` members of an .npz (all when None)."""
    with _npy_or_npz(path, what) as (stream, is_npz):
        if is_npz:
            with zipfile.ZipFile(stream) as archive:
                return _read_members(archive, _checked_members(archive, path, limit_bytes, wanted))
        _check_header(stream, os.fstat(stream.fileno()).st_size, f"{path}", limit_bytes)
        stream.seek(0)
        return np.lib.format.read_array(stream, allow_pickle=False, max_header_size=MAX_NPY_HEADER)


def npz_names(path: Path, what: str, limit_bytes: int | None) -> list[str]:
    """The array names of an .npz, every member's header checked as read_arrays checks it; no array is read."""
    with _npy_or_npz(path, what) as (stream, is_npz):
        if not is_npz:
            raise InputError(f"{path}: not an .npz file (named arrays)")
        with zipfile.ZipFile(stream) as archive:
            return [member.filename.removesuffix(".npy") for member in _checked_members(archive, path, limit_bytes, None)]


@contextlib.contextmanager
def _npy_or_npz(path: Path, what: str) -> Iterator[tuple[BinaryIO, bool]]:
    """The file opened as open_regular opens it, at its start, and whether it is an .npz (a zip); a file numpy
    cannot read is one line."""
    try:
        with open_regular(path, what) as stream:
            is_npz = zipfile.is_zipfile(stream)
            stream.seek(0)
            yield stream, is_npz
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError) as error:
        raise InputError(f"{path}: not a readable .npy/.npz file ({one_line(error)})") from None


def _checked_members(archive: zipfile.ZipFile, path: Path, limit_bytes: int | None,
                     wanted: Collection[str] | None) -> list[zipfile.ZipInfo]:
    """The `wanted` members (all when None), once every member's header is checked: a pickle anywhere in the file is
    refused, and the arrays wanted fit the limit together."""
    members = archive.infolist()
    if len(members) > MAX_NPZ_MEMBERS:
        raise InputError(f"{path}: {len(members)} arrays, more than {MAX_NPZ_MEMBERS}: refused")
    chosen = [m for m in members if wanted is None or m.filename.removesuffix(".npy") in wanted]
    total = 0
    for member in members:
        with archive.open(member) as entry:
            label = f"{path}: array {one_line(member.filename.removesuffix('.npy'), 100)!r}"
            declared = _check_header(entry, member.file_size, label, limit_bytes)
        total += declared if member in chosen else 0
    if limit_bytes is not None and total > limit_bytes:
        raise InputError(f"{path}: the arrays needed take {memory_text(total)}, above the memory limit "
                         f"{memory_text(limit_bytes)}")
    return chosen


def _read_members(archive: zipfile.ZipFile, members: list[zipfile.ZipInfo]) -> dict:
    arrays = {}
    for member in members:
        with archive.open(member) as entry:
            arrays[member.filename.removesuffix(".npy")] = np.lib.format.read_array(
                entry, allow_pickle=False, max_header_size=MAX_NPY_HEADER)
    return arrays


def _check_header(stream, stored_bytes: int, label: str, limit_bytes: int | None) -> int:
    """The array's declared size in bytes, once its dtype is a real number type and its size fits
    both the bytes present (a header may claim 10^11 rows) and the limit."""
    version = np.lib.format.read_magic(stream)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(stream, max_header_size=MAX_NPY_HEADER)  # a huge header is refused, not parsed
    if dtype.hasobject:
        raise InputError(f"{label} is a pickled object array: refused (pickles are never loaded)")
    if dtype.kind not in "biuf":
        what = {"U": "unicode strings", "S": "byte strings", "c": "complex numbers", "V": "raw records", "M": "dates",
                "m": "time spans"}.get(dtype.kind, f"dtype {dtype}")
        raise InputError(f"{label} holds {what} ({dtype.str}): expected real numbers")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared > stored_bytes:
        raise InputError(f"{label}: its header declares shape {list(shape)} ({declared} bytes) but the file holds {stored_bytes}")
    if limit_bytes is not None and declared > limit_bytes:
        raise InputError(f"{label} needs {memory_text(declared)}, above the memory limit {memory_text(limit_bytes)}")
    return declared


def one_line(text: object, limit: int = 300) -> str:
    """A user-supplied or error text as one short line: never a multi-megabyte echo of a hostile name."""
    flat = " ".join(str(text).split())
    if not flat and isinstance(text, BaseException):
        return type(text).__name__
    return flat if len(flat) <= limit else flat[:limit] + f"… ({len(flat)} characters)"
