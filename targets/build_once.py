"""Build a cache entry once, whole, however many cells or runs ask for it at the same time.

Every hand-written cache of the targets (converted .tflite and .mlpackage files,
fixed-batch ONNX copies, the converter environments) follows one rule: a file
lock named `<entry>.lock` beside the entry is held while the entry is checked
and built, and the entry appears in one step (a rename of a finished staging
copy), so a reader sees all of it or none and a killed build leaves only a
staging copy nobody reads. The lock is filelock's (flock on Unix): it is
released when its holder dies, so a crashed build never blocks the next one. A lock file
outlives its build (deleting it while another process waits on it would let a third build
beside the one that waits): a cache whose folder is read as a list of entries (the runtime
releases) keeps its locks in a folder of their own.

A converter's refusal (its own words, given the same model and pins) is an entry too, so a
re-run does not convert again to fail the same way: its words in REFUSAL, a file of its own, so
code that knows only finished conversions (an older checkout sharing the cache) converts again
rather than misreading it. One that ran out of memory is not cached (targets.out_of_memory): a larger
cap may convert it. A build killed or timed out raises, leaving none.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from .out_of_memory import looks_out_of_memory

REFUSAL = "refusal.json"  # {"error": the converter's words}


@contextlib.contextmanager
def exclusive(entry: Path, lock: Path | None = None) -> Iterator[None]:
    """Hold the entry's lock (`<entry>.lock` unless `lock` names another file): one builder at a time, across processes."""
    from filelock import FileLock  # here: importing it costs each cell worker 10-30 ms of CPU, and most never build anything

    lock = lock or entry.with_name(f"{entry.name}.lock")
    entry.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        yield


def build_once(entry: Path, build: Callable[[Path], None], ready: Callable[[Path], bool] = Path.exists,
               lock: Path | None = None) -> bool:
    """Make `entry` unless `ready(entry)`; True when this call made it.

    `build(staging)` writes the whole entry (a file or a folder) at `staging`, a
    fresh sibling path; it is renamed onto `entry` once build returns. A build
    that raises leaves no entry, and the next call tries again.
    """
    if ready(entry):
        return False
    with exclusive(entry, lock):
        if ready(entry):  # another process built it while this one waited
            return False
        staging = entry.with_name(f"{entry.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        try:
            build(staging)
            _remove(entry)  # an unusable leftover (ready() said no): replaced, never merged into
            os.replace(staging, entry)
        finally:
            _remove(staging)
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def keep_refusal(staging: Path, words: str) -> None:
    """A converter's refusal becomes the entry (`staging`): the next run reads its words instead of converting
    again. Words that say it ran out of memory raise instead, leaving no entry: a larger cap may convert it."""
    if looks_out_of_memory(words):
        raise RuntimeError(words)
    staging.mkdir(exist_ok=True)
    (staging / REFUSAL).write_text(json.dumps({"error": words}))


def converted_or_refused(marker: str) -> Callable[[Path], bool]:
    """`build_once`'s `ready` for a conversion entry: its `marker` file, or a refusal, is there."""
    return lambda entry: (entry / marker).exists() or (entry / REFUSAL).exists()


def cached_words(converter: str) -> str:
    """What follows a converter's words read from the cache instead of said by this run."""
    return f" ({converter}'s words when it converted this model, cached)"


def raise_if_refused(entry: Path, made: bool, converter: str) -> None:
    """The converter's words when it refused the model, now (`made`) or in the run that cached them."""
    if (entry / REFUSAL).exists():
        raise RuntimeError(json.loads((entry / REFUSAL).read_text())["error"] + ("" if made else cached_words(converter)))
