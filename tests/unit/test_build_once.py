"""The one rule of the targets' caches (targets/build_once.py): built once under the entry's lock,
appearing whole or not at all, and a failed or half-made build never served."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from targets.build_once import build_once
from targets.out_of_memory import looks_out_of_memory

BUILDERS = 3
WAIT_S = 60


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {WAIT_S} s for {what}")
        time.sleep(0.01)


def build_in_a_process(entry: Path, results: Path) -> None:
    """One builder. Each records when it finds the entry missing; a build waits until every builder
    has, so all are past the unlocked first look at once: with the lock the others wait and then
    reuse the entry, without it they would build too (decided by the rule, not by timing)."""

    def ready(path: Path) -> bool:
        if path.exists():
            return True
        (results / f"missing-{os.getpid()}").touch()
        return False

    def build(staging: Path) -> None:
        staging.write_text(str(os.getpid()))
        wait_for(lambda: len(list(results.glob("missing-*"))) >= BUILDERS, "every builder to find the entry missing")

    made = build_once(entry, build, ready)
    (results / f"outcome-{os.getpid()}").write_text("built" if made else "reused")


def test_builders_in_several_processes_build_once_and_the_others_wait_for_it(tmp_path):
    entry, results = tmp_path / "cache" / "entry", tmp_path / "results"
    results.mkdir()
    spawn = multiprocessing.get_context("spawn")
    builders = [spawn.Process(target=build_in_a_process, args=(entry, results)) for _ in range(BUILDERS)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(WAIT_S * 2)
    assert [builder.exitcode for builder in builders] == [0] * BUILDERS
    outcomes = {path.name.removeprefix("outcome-"): path.read_text() for path in results.glob("outcome-*")}
    assert sorted(outcomes.values()) == ["built"] + ["reused"] * (BUILDERS - 1)
    assert entry.read_text() == next(pid for pid, outcome in outcomes.items() if outcome == "built")
    assert not list(entry.parent.glob("*.tmp"))


def test_a_failed_build_leaves_no_entry_and_the_next_call_builds(tmp_path):
    entry = tmp_path / "entry"

    def half_then_fail(staging: Path) -> None:
        staging.mkdir()
        (staging / "part").write_text("half")
        raise RuntimeError("the converter's own words")

    with pytest.raises(RuntimeError, match="the converter's own words"):
        build_once(entry, half_then_fail)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["entry.lock"]
    assert build_once(entry, lambda staging: staging.write_text("whole")) is True
    assert entry.read_text() == "whole"
    assert build_once(entry, lambda staging: pytest.fail("a ready entry is built again")) is False


def test_an_entry_that_is_not_ready_is_replaced_not_merged_into(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "stale.tflite").write_text("left by an older recipe")
    ready = lambda path: (path / "meta.json").exists()  # noqa: E731

    def build(staging: Path) -> None:
        staging.mkdir()
        (staging / "meta.json").write_text("{}")

    assert build_once(entry, build, ready) is True
    assert sorted(path.name for path in entry.iterdir()) == ["meta.json"]


@pytest.mark.parametrize("words, ran_out", [
    ("MemoryError: ", True),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate 4194304 bytes. Error code 12 (Cannot allocate memory)", True),
    ("RuntimeError: std::bad_alloc", True),
    ("RuntimeError: NotImplementedError: onnx2torch has no Cast converter for schema version 23, only for 9, 13", False),
    ("CastLike OP is not yet implemented in onnx2tf (No module named 'onnx2tf.ops.CastLike')", False),
])
def test_only_a_converter_that_ran_out_of_memory_is_not_cached(words, ran_out):
    assert looks_out_of_memory(words) is ran_out
