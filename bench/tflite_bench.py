"""What the tflite targets cost: conversion time per policy, and how the reported
latency compares with a bare `invoke()` loop, measured side by side in one run.

1. conversion: one fresh onnx2tf run per policy and recipe (a private cache, so
   nothing is reused): "dynamic" writes fp32 + fp16 + dynamic-range int8,
   "full" the calibrated full-integer int8;
2. in-process: the harness's timing loop (TfliteSession.time: set inputs,
   invoke, read outputs, as ORT's run() does) against a bare interpreter.invoke()
   loop on the same interpreter, interleaved in rounds so machine noise hits
   both alike, with and without XNNPACK;
3. end to end: the p50 a real `tflite` fp32 cell reports (its own worker
   process) against that bare loop.

    .venv/bin/python bench/tflite_bench.py [--iters 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from cell_timing import cell_p50

import targets
from matrix.inputs import examples, model, observations
from targets.paths import cache_dir
from targets.base import PrepareContext
from targets.tflite_session import TfliteSession


def conversion_seconds(name: str, recipe_target: str, variant: str) -> float:
    info = model.load(examples.path(name))
    with tempfile.TemporaryDirectory() as scratch:
        ctx = PrepareContext(onnx_variants={"fp32": info.path}, calibration=observations.seeded(info, 128, 0),
                             batch_axes=info.batch_axes, workdir=Path(scratch), cache_dir=Path(scratch) / "cache")
        started = time.perf_counter()
        targets.get(recipe_target).prepare(ctx, variant)
        return time.perf_counter() - started


def bare_invoke(session: TfliteSession, feeds, iters: int) -> list[int]:
    session.run(feeds)  # inputs set and resized once; only invoke() is timed
    invoke, clock, samples = session.interpreter.invoke, time.perf_counter_ns, []
    for _ in range(iters):
        start = clock()
        invoke()
        samples.append(clock() - start)
    return samples


def latency_rows(name: str, iters: int, rounds: int) -> None:
    info = model.load(examples.path(name))
    all_feeds = observations.seeded(info, 64, 0)
    with tempfile.TemporaryDirectory() as scratch:
        ctx = PrepareContext(onnx_variants={"fp32": info.path}, calibration=all_feeds,
                             batch_axes=info.batch_axes, workdir=Path(scratch), cache_dir=cache_dir())
        for target_name in ("tflite", "tflite-noxnn"):
            target = targets.get(target_name)
            artifact = target.prepare(ctx, "fp32")
            for batch in (1, 64):
                feeds = observations.take(all_feeds, batch, info.batch_axes)
                session = target.open(artifact, threads=1)
                bare, timed = [], []
                for _ in range(rounds):
                    bare += bare_invoke(session, feeds, iters)
                    timed += session.time(feeds, warmup=10, iters=iters)
                bare_p50, timed_p50 = np.median(bare) / 1e3, np.median(timed) / 1e3
                cell = cell_p50("tflite", info, all_feeds, batch, iters) if target_name == "tflite" else float("nan")
                print(f"{name:<16}{target_name:<14}{batch:>6}{bare_p50:>13.2f}{timed_p50:>13.2f}"
                      f"{timed_p50 / bare_p50:>8.3f}{cell:>11.2f}{cell / bare_p50:>8.3f}")
                session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'policy':<16}{'dynamic (fp32+fp16+int8) s':>28}{'full int8 s':>13}")
    for name in examples.BUILDERS:
        dynamic = conversion_seconds(name, "tflite", "fp32")
        full = conversion_seconds(name, "tflite-int8-full", "int8")
        print(f"{name:<16}{dynamic:>28.1f}{full:>13.1f}")
    print()
    print(f"{'policy':<16}{'target':<14}{'batch':>6}{'bare p50 us':>13}{'harness p50':>13}{'ratio':>8}"
          f"{'cell p50':>11}{'ratio':>8}")
    for name in examples.BUILDERS:
        latency_rows(name, args.iters, args.rounds)


if __name__ == "__main__":
    main()
