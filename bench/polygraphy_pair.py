"""A single-runtime check against Polygraphy, the tool people would otherwise use for it.

Pairs `policy-matrix -q run continuous_mlp.onnx --targets ort-cpu --variants fp32` (reference,
percentiles, report) with `polygraphy run continuous_mlp.onnx --onnxrt --onnxrt --iterations 200`
(two ORT runners and a comparison), alternating within each pair so machine noise hits both alike,
and prints each pair's ratio and the median ratio. Goal: <= 1.2x.

Polygraphy comes from a scratch virtual environment this script makes under the cache
(`pip install polygraphy --no-deps`, with this environment's onnx/onnxruntime/numpy visible
through a .pth file, so both tools run the same onnxruntime), or from --polygraphy PATH.

    .venv/bin/python bench/polygraphy_pair.py [--pairs 5] [--polygraphy /path/to/polygraphy]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
from pathlib import Path

from matrix.inputs import examples
from targets.paths import cache_dir

GOAL = 1.2


def scratch_polygraphy() -> Path:
    """Polygraphy in <cache>/bench/polygraphy-venv, made on first use."""
    home = cache_dir() / "bench" / "polygraphy-venv"
    tool = home / "bin" / "polygraphy"
    if tool.exists():
        return tool
    venv.create(home, with_pip=True, clear=True)
    python = home / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "policy-matrix-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # this env's onnxruntime
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "polygraphy"], check=True)
    return tool


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--polygraphy", type=Path, help="a polygraphy executable (default: a scratch venv under the cache)")
    args = parser.parse_args()
    tool = args.polygraphy or scratch_polygraphy()
    model = examples.path("continuous_mlp")
    ratios, ours, theirs = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        matrix = [sys.executable, "-m", "matrix", "-q", "run", str(model), "--targets", "ort-cpu", "--variants", "fp32",
                  "--out", str(Path(scratch) / "report"), "--fail-on", "never"]
        polygraphy = [str(tool), "run", str(model), "--onnxrt", "--onnxrt", "--iterations", "200"]
        seconds(polygraphy)  # both once untimed: first-use caches (the venv's .pyc files, the page cache)
        seconds(matrix)
        print(f"{'pair':>4} {'policy-matrix s':>16} {'polygraphy s':>13} {'ratio':>7}")
        for index in range(args.pairs):
            first, second = (matrix, polygraphy) if index % 2 == 0 else (polygraphy, matrix)
            timed = {id(first): seconds(first), id(second): seconds(second)}
            ours.append(timed[id(matrix)])
            theirs.append(timed[id(polygraphy)])
            ratios.append(ours[-1] / theirs[-1])
            print(f"{index + 1:>4} {ours[-1]:>16.2f} {theirs[-1]:>13.2f} {ratios[-1]:>6.2f}x")
    ratio = statistics.median(ratios)
    print(f"median: policy-matrix {statistics.median(ours):.2f} s, polygraphy {statistics.median(theirs):.2f} s, "
          f"ratio {ratio:.2f}x (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'MISSED'})")


if __name__ == "__main__":
    main()
