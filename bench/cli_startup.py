"""How long the CLI takes to start, side by side with bare Python + numpy.

`policy-matrix --version` and `--help` against `python -c "import numpy"` (median of
interleaved rounds, so machine noise hits all alike). Target: within 2x; shell completion
pays this on every TAB. A whole ort-cpu fp32 run against Polygraphy: bench/polygraphy_pair.py.

    .venv/bin/python bench/cli_startup.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUDGET = 2.0


def cli() -> list[str]:
    script = Path(sys.executable).parent / "policy-matrix"
    return [str(script)] if script.exists() else [sys.executable, "-m", "matrix"]


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def medians(commands: dict[str, list[str]], rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            samples[name].append(seconds(command))
    return {name: statistics.median(values) for name, values in samples.items()}


def startup(rounds: int) -> dict[str, float]:
    found = medians({"python -c 'import numpy'": [sys.executable, "-c", "import numpy"],
                     "policy-matrix --version": [*cli(), "--version"],
                     "policy-matrix --help": [*cli(), "--help"]}, rounds)
    numpy_s = found["python -c 'import numpy'"]
    print(f"{'command':32} {'median s':>9} {'x numpy':>8}")
    for name, value in found.items():
        print(f"{name:32} {value:9.3f} {value / numpy_s:8.2f}")
    worst = max(found["policy-matrix --version"], found["policy-matrix --help"]) / numpy_s
    print(f"startup budget {BUDGET:.1f}x numpy: {'met' if worst <= BUDGET else 'MISSED'} ({worst:.2f}x)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    startup(args.rounds)


if __name__ == "__main__":
    main()
