"""Does the harness inflate ort-cpu latency? Ratios measured side by side in one run.

1. in-process: the harness's timing loop (OrtSession.time) against a bare
   InferenceSession.run loop on the same session, interleaved in rounds so
   machine noise hits both alike;
2. end to end: the p50 a real ort-cpu cell reports (its own worker process)
   against the bare loop in this process.
Target: both ratios below 1.10.

    .venv/bin/python bench/ort_cpu_overhead.py [--iters 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from cell_timing import cell_p50

from matrix.inputs import examples, model, observations
from targets.base import Artifact
from targets.ort_cpu import OrtSession


def bare_loop(session: ort.InferenceSession, feeds, iters: int) -> list[int]:
    samples = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        samples.append(time.perf_counter_ns() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'policy':<16}{'batch':>6}{'bare p50 us':>13}{'harness p50':>13}{'ratio':>8}{'cell p50':>11}{'ratio':>8}")
    for name in examples.BUILDERS:
        info = model.load(examples.path(name))
        all_feeds = observations.seeded(info, 64, 0)
        for batch in (1, 64):
            feeds = observations.take(all_feeds, batch, info.batch_axes)
            harness = OrtSession(Artifact(path=info.path), ["CPUExecutionProvider"], threads=1)
            bare_session = harness.session  # the very same session: only the loop differs
            bare, timed = [], []
            for _ in range(args.rounds):
                bare += bare_loop(bare_session, feeds, args.iters)
                timed += harness.time(feeds, warmup=10, iters=args.iters)
            bare_p50, timed_p50 = np.median(bare) / 1e3, np.median(timed) / 1e3
            cell = cell_p50("ort-cpu", info, all_feeds, batch, args.iters)
            print(f"{name:<16}{batch:>6}{bare_p50:>13.2f}{timed_p50:>13.2f}{timed_p50 / bare_p50:>8.3f}{cell:>11.2f}{cell / bare_p50:>8.3f}")


if __name__ == "__main__":
    main()
