"""The timing loop of every target that runs the model in a Python process it controls.

Standard library only: coreml_predict.py imports it from this folder while running in the
CoreML environment, where policy-matrix itself is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def time_calls(call: Callable[[], object], warmup: int, iters: int) -> list[int]:
    """`call` run `warmup` times untimed, then `iters` times, each timed alone (ns, monotonic clock)."""
    for _ in range(warmup):
        call()
    clock, samples = time.perf_counter_ns, []
    for _ in range(iters):
        start = clock()
        call()
        samples.append(clock() - start)
    return samples
