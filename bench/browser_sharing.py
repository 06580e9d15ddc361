"""One browser with a context per web target, or a browser per target's worker started side by side?

Opens the three web targets' harness pages (targets/chromium.HarnessPage: a private local server, one
ORT bundle imported) both ways and prints the wall time until all three pages are ready and the peak
resident memory of this process's tree (bench/matrix_wall.py's sampler, summed over its processes):

- separate, one at a time: three worker-like processes, each launching its own Chromium, one after
  another (what a run did before the web targets shared one worker: Target.worker_group);
- separate, at once: the same three started together;
- shared: one process, one Chromium, three isolated contexts (one page each), opened one after another
  (Playwright's sync API drives a browser from one thread): what a run does now.

    .venv/bin/python bench/browser_sharing.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

import psutil

BUNDLES = ("ort.wasm.min.mjs", "ort.webgl.min.mjs", "ort.min.mjs")  # wasm, webgl, webgpu


def _open_pages(bundles: list[str]) -> None:
    """In a child: open the bundles' pages as a worker does (targets.chromium.HarnessPage): one browser
    for the process, a context each."""
    from targets.chromium import HarnessPage

    for bundle in bundles:
        HarnessPage(bundle)


def measure(groups: list[list[str]], at_once: bool) -> tuple[float, int]:
    """Wall time until every group's process has its pages open, and the peak RSS of the tree."""
    from matrix_wall import TreeUsage, sample_while  # here, not at the top: the children (--open) need none of it

    started, usage = time.perf_counter(), TreeUsage()
    batches = [groups] if at_once else [[group] for group in groups]
    for batch in batches:
        processes = [subprocess.Popen([sys.executable, __file__, "--open", ",".join(group)]) for group in batch]
        sampler = threading.Thread(target=sample_while, daemon=True, args=(  # this process's tree: the batch's
            usage, psutil.Process(), lambda: any(process.poll() is None for process in processes)))
        sampler.start()
        for process in processes:
            process.wait()
        sampler.join()
    return time.perf_counter() - started, usage.peak_rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--open", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.open:
        _open_pages(args.open.split(","))
        return
    separate = [[bundle] for bundle in BUNDLES]
    ways = {"separate, one at a time": (separate, False), "separate, 3 browsers at once": (separate, True),
            "shared (1 browser, 3 contexts)": ([list(BUNDLES)], True)}
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, (groups, at_once) in ways.items():
            samples[name].append(measure(groups, at_once))
    print(f"{'way':32} {'median s':>9} {'peak RSS GiB':>13}")
    for name, rows in samples.items():
        print(f"{name:32} {statistics.median(r[0] for r in rows):9.2f} {statistics.median(r[1] for r in rows) / 2**30:13.2f}")


if __name__ == "__main__":
    main()
