"""The report folder is the tool's: the tool writes only into its own folders, and nothing planted in one
redirects what it writes.

`claim` takes a folder for a command's output (`run --out/--resume`, `merge --out`, `bisect --out`,
`frameworks --out`): a new or empty folder, or one the tool wrote before (its mark, the lock file, is left in
every folder it takes; reports written before the mark are known by their run record or results). Any other
folder is the user's: its index.html or summary.md would be overwritten without a word, so it is refused.

A symbolic link where the tool writes (run.json, results.jsonl, reference.npz, a cell's folder,
a `.partial` staging name, the lock) would make a run overwrite or append to whatever the link
names. Before a run or a merge takes the folder, every name the tool writes and everything below
the folders it owns is checked: a link there, or a lock that is not a regular file, is refused
with one line. The journal, the one file opened for appending, is also opened with O_NOFOLLOW.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import InputError

LOCK_FILE = ".policy-matrix.lock"
# Every file the tool writes at the top of a report folder (report.write_all, orchestrate.run).
TOOL_FILES = ("run.json", "results.jsonl", "results.json", "results.csv", "latency.csv", "summary.md", "junit.xml",
              "index.html", "observations.npz", "reference.npz", "reference_margins.npz")
# Folders the tool fills; everything inside them is its own.
TOOL_FOLDERS = ("cells", "variants", "reference", "diagnosis", "fixes")
# What only the tool writes, by which it knows a folder it took before: its mark, a run's record and journal,
# a merged report's results, the frameworks table's.
OWN_MARKS = (LOCK_FILE, "run.json", "results.jsonl", "results.json", "frameworks.json")


def claim(path: Path, option: str = "--out") -> Path:
    """Take `path` for the tool's output: created if needed, proven writable and marked as the tool's before any
    measurement is made; a folder holding anything the tool did not write there is refused."""
    shown = str(path)[:200]
    try:
        if path.exists() and not path.is_dir():
            raise InputError(f"{option} {shown!r}: exists and is not a folder")
        path.mkdir(parents=True, exist_ok=True)
        held = sorted(entry.name for entry in path.iterdir())
        if not held:
            os.close(os.open(path / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        elif not any(os.path.lexists(path / mark) for mark in OWN_MARKS):
            raise InputError(f"{option} {shown!r}: a folder that is not a policy-matrix report (it holds "
                             f"{', '.join(map(repr, held[:3]))}{', ...' if len(held) > 3 else ''}): refused, its files "
                             "would be overwritten (choose a new or empty folder)")
        with tempfile.TemporaryFile(dir=path):  # writable, before any measurement is made
            pass
    except (OSError, ValueError) as error:  # ValueError: a NUL in the name
        raise InputError(f"{option} {shown!r}: cannot write there ({getattr(error, 'strerror', None) or error})") from None
    return path


def check_owned(out: Path) -> None:
    """Refuse a report folder with a symbolic link where the tool writes, or a lock that is not a regular file."""
    for name in (*TOOL_FILES, *(f".{name}.partial" for name in TOOL_FILES), *TOOL_FOLDERS):
        _refuse_link(out / name, out)
    lock = out / LOCK_FILE
    _refuse_link(lock, out)
    if lock.exists() and not lock.is_file():
        raise InputError(f"{lock}: the run lock is not a regular file: refused (remove it)")
    for folder in TOOL_FOLDERS:
        for root, dirs, files in os.walk(out / folder):  # walk never follows links to folders
            for name in (*dirs, *files):
                _refuse_link(Path(root) / name, out)


def _refuse_link(path: Path, out: Path) -> None:
    if path.is_symlink():
        raise InputError(f"{path}: a symbolic link inside the report folder {out}, where policy-matrix writes: refused "
                         "(remove it, or choose another --out)")


def append_line(path: Path, line: str) -> None:
    """One line appended and flushed; never through a link planted after the folder was checked."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(descriptor, "a") as stream:
        stream.write(line)
        stream.flush()


def write_atomic(path: Path, text: str) -> None:
    write_atomic_with(path, lambda stream: stream.write(text.encode("utf-8")))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """The whole file or the previous one, never a truncated one (a full disk, a kill): `write` fills a
    staging name of its own beside `path` (created exclusively, so a link planted there is never followed,
    and unique, so two processes writing the same cache entry never share one), renamed over `path`."""
    descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
        os.chmod(staging, 0o644)  # mkstemp's 0600 would differ from every other file the tool writes
        os.replace(staging, path)
    finally:
        Path(staging).unlink(missing_ok=True)
