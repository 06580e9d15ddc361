"""How much does the harness add to what onnxruntime-web reports, and what does a run cost?

1. Per web backend, side by side in one page: the p50 that `Session.time` reports
   (performance.now() around each awaited session.run) against a bare loop of
   session.run timed once around the loop, and against one Python -> page round
   trip per call (what timing from Python would have measured instead).
2. The wall time of the four web/node targets in one real `policy-matrix run`
   (every precision), from the run's own per-cell durations.

    .venv/bin/python bench/web_overhead.py [--model PATH] [--iters N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matrix.inputs import examples  # noqa: E402
from matrix.inputs.model import load as load_model  # noqa: E402
from targets import REGISTRY  # noqa: E402
from targets.base import Artifact  # noqa: E402

WEB = ("ort-web-wasm", "ort-web-webgl", "ort-web-webgpu")
ALL = ("ort-node", *WEB)


def one_observation(path: Path) -> dict[str, np.ndarray]:
    graph_input = onnx.load(str(path)).graph.input[0]
    shape = [dim.dim_value or 1 for dim in graph_input.type.tensor_type.shape.dim]
    return {graph_input.name: np.random.default_rng(0).normal(size=shape).astype(np.float32)}


def python_round_trip_ns(session, feeds, iters: int) -> float:
    samples = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        session.run(feeds)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples)


def in_page_overhead(model: Path, iters: int, cache: Path) -> None:
    print(f"in-page timing vs bare session.run loop ({model.name}, batch 1, {iters} calls)")
    print("(bare loop: mean per call, median of 5 loops; ratios are reported / bare and python-driven / reported p50)")
    print(f"{'target':16} {'p50 us':>9} {'mean us':>9} {'bare us':>9} {'p50/bare':>9} {'mean/bare':>9} {'python-driven us':>17} {'ratio':>6}")
    feeds = one_observation(model)
    for name in WEB:
        session = REGISTRY[name].open(Artifact(model, variant="fp32", cache_dir=cache, batch_axes=load_model(model).batch_axes), threads=1)
        try:
            session.bare_loop_ns(feeds, 20)  # warm up
            samples = session.time(feeds, warmup=0, iters=iters)
            p50, mean = statistics.median(samples), statistics.fmean(samples)
            bare = statistics.median(session.bare_loop_ns(feeds, max(len(samples) // 5, 1)) for _ in range(5))
            driven = python_round_trip_ns(session, feeds, min(iters, 50))
        finally:
            session.close()
        print(f"{name:16} {p50 / 1e3:9.1f} {mean / 1e3:9.1f} {bare / 1e3:9.1f} {p50 / bare:9.2f} {mean / bare:9.2f}"
              f" {driven / 1e3:17.1f} {driven / p50:6.2f}")


def run_wall_time(model: Path) -> None:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "matrix", "run", str(model), "--targets", ",".join(ALL), "--out", out, "--fail-on", "never"],
            check=True, capture_output=True, text=True, cwd=ROOT,
        )
        wall = time.perf_counter() - started
        cells = json.loads((Path(out) / "results.json").read_text())["cells"]
    print(f"\nwall time of one `policy-matrix run` over {', '.join(ALL)} (fp32, fp16, int8): {wall:.1f} s")
    for name in ALL:
        mine = [cell for cell in cells if cell["target"] == name]
        seconds = sum(cell.get("duration_s") or 0.0 for cell in mine)
        verdicts = " ".join(f"{cell['variant']}={cell['verdict']}" for cell in mine)
        print(f"  {name:16} {seconds:6.1f} s   {verdicts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=examples.path("continuous_mlp"))
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--skip-run", action="store_true", help="only the in-page comparison")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        in_page_overhead(args.model, args.iters, Path(cache))
    if not args.skip_run:
        run_wall_time(args.model)


if __name__ == "__main__":
    main()
