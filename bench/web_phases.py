"""Where the browser chain's CPU goes: per web target, per process kind and per phase.

Runs `policy-matrix run --targets 'ort-web-*'` once for its cells (their specs: observations, variants,
settings), then serves those same cells again in this process, in the run's order, through the worker's own
code (matrix.run.worker.main, as `--serve` does, with no gate), and reads every process's CPU
(psutil cpu_times) at each phase boundary. A phase is a worker stage (open, contract, parity, latency,
placement, ...) crossed with the Playwright call it was in (the driver's start, the launch, a new context or
page, a CDP command, the harness's goto, and each `window.harness.X` evaluate: load = the ORT bundle's import, probe,
startRuntime, open = a session's creation, run, time, release); "python" is the worker's own work between
those calls (encoding feeds, fixed-batch copies, saving measurement files). The last target's page, the
browser and the driver are closed at the end ("close").

Processes are the worker (python, this process: its readings leave out the sampling's own CPU), the
Playwright driver (node) and Chromium's browser, GPU, renderer and utility processes. A process that
ends between two readings (a context's renderer when its context closes) loses what it spent after
the earlier one.

    .venv/bin/python bench/web_phases.py                      # continuous MLP, the three web targets
    .venv/bin/python bench/web_phases.py --targets ort-web-wasm --variants fp32
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from matrix_wall import POLICIES, ROOT, process_kind

from playwright.sync_api import Browser, BrowserContext, BrowserType, CDPSession, Page
from playwright.sync_api._context_manager import PlaywrightContextManager

KINDS = ("python", "node: Playwright driver", "chromium browser", "chromium gpu process", "chromium renderer",
         "chromium utility", "chromium zygote")
CALLS = {  # (class, method) -> phase name
    (PlaywrightContextManager, "start"): "driver start",
    (BrowserType, "launch"): "launch",
    (Browser, "new_context"): "new context",
    (BrowserContext, "new_page"): "new page",
    (Page, "goto"): "goto",
    (Page, "wait_for_function"): "goto",
    (BrowserContext, "close"): "close context",
    (CDPSession, "send"): "cdp",
    (Browser, "close"): "close browser",
}
HARNESS_CALL = re.compile(r"window\.harness\.(\w+)\(")


class PhaseCpu:
    """CPU seconds and wall seconds per (target, stage, phase) and process kind, read at each boundary."""

    def __init__(self):
        self.me = psutil.Process()
        self.previous: dict[tuple, float] = {}
        self.kinds: dict[tuple, str] = {}
        self.sampling_cpu = 0.0  # this process's CPU spent reading the others: not the worker's
        self.cpu: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
        self.wall: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.where = ("", "", "")  # (target, stage, phase) the CPU since the last reading belongs to
        self.last_wall = time.perf_counter()
        self.read()

    def read(self) -> dict[tuple, float]:
        """CPU seconds per process now (this process's without what its readings cost)."""
        began = time.process_time()
        now = {}
        for process in self.me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    if key not in self.kinds:
                        self.kinds[key] = process_kind(process.name(), process.cmdline())
                    times = process.cpu_times()
                    now[key] = times.user + times.system
        self.sampling_cpu += time.process_time() - began
        now[("self", 0)] = time.process_time() - self.sampling_cpu
        self.kinds[("self", 0)] = "python"
        return now

    def boundary(self, where: tuple[str, str, str]) -> None:
        """Charge what every process spent since the last boundary to the phase that ends, then enter `where`."""
        now = self.read()
        for key, seconds in now.items():
            self.cpu[self.where][self.kinds[key]] += seconds - self.previous.get(key, 0.0)
        self.previous = now
        clock = time.perf_counter()
        self.wall[self.where] += clock - self.last_wall
        self.last_wall = clock
        self.where = where
        self.calls[where] += 1

    @contextlib.contextmanager
    def phase(self, name: str):
        target, stage, outer = self.where
        self.boundary((target, stage, name))
        try:
            yield
        finally:
            self.boundary((target, stage, outer))


def instrument(phases: PhaseCpu) -> None:
    """Every Playwright call the worker makes, and every worker stage, becomes a phase boundary."""
    for (owner, method), name in CALLS.items():
        setattr(owner, method, _timed(phases, getattr(owner, method), lambda *_, name=name: name))
    setattr(Page, "evaluate", _timed(phases, Page.evaluate, lambda _, expression, *__: _harness_call(expression)))

    from matrix.run import worker

    def stage(name: str, *_) -> None:
        target, _, _ = phases.where
        phases.boundary((target, name, "python"))

    worker.stage = stage


def _harness_call(expression: str) -> str:
    found = HARNESS_CALL.search(expression)
    return f"harness.{found.group(1)}" if found else "evaluate"


def _timed(phases: PhaseCpu, call, name_of):
    def timed(*args, **kwargs):
        with phases.phase(name_of(*args)):
            return call(*args, **kwargs)

    return timed


def cells_of_a_run(policy: Path, targets: str, variants: str, out: Path) -> list[Path]:
    """A real run's web cells, in the order its worker served them."""
    command = [sys.executable, "-m", "matrix", "-q", "run", str(policy), "--out", str(out), "--targets", targets,
               "--variants", variants, "--fail-on", "never"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    cells = [folder for folder in (out / "cells").iterdir() if (folder / "spec.json").is_file()]
    return sorted(cells, key=lambda folder: (folder / "spec.json").stat().st_mtime)


def serve(cells: list[Path], phases: PhaseCpu) -> None:
    from matrix.run import worker
    from targets import chromium

    for cell in cells:
        target = json.loads((cell / "spec.json").read_text())["target"]
        phases.boundary((target, "between cells", "python"))
        worker.main(cell)
    phases.boundary(("", "close", "python"))
    if worker._served is not None:
        worker._served.stop_runtime()
    chromium._close_pages()
    phases.boundary(("", "", ""))


def print_breakdown(phases: PhaseCpu) -> None:
    shown = [kind for kind in KINDS if any(row[kind] > 0.005 for row in phases.cpu.values())]
    header = f"{'target':16}{'stage':15}{'phase':22}{'calls':>6}{'wall s':>8}" + "".join(f"{_short(k):>10}" for k in shown) + f"{'CPU s':>8}"
    print(header)
    totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for where in sorted(phases.cpu, key=list(phases.cpu).index):
        target, stage, phase = where
        row = phases.cpu[where]
        if not target and not stage:
            continue
        cpu = sum(row[k] for k in shown)
        totals[target or "(close)"].update(row)
        totals[target or "(close)"]["wall"] += phases.wall[where]
        if cpu < 0.005 and phases.wall[where] < 0.005:
            continue
        print(f"{target:16}{stage:15}{phase:22}{phases.calls[where]:>6}{phases.wall[where]:>8.2f}"
              + "".join(f"{row[k]:>10.2f}" for k in shown) + f"{cpu:>8.2f}")
    print("\nper target")
    print(f"{'target':16}{'wall s':>8}" + "".join(f"{_short(k):>10}" for k in shown) + f"{'CPU s':>8}")
    everything: collections.Counter = collections.Counter()
    for target, row in totals.items():
        everything.update(row)
        print(f"{target:16}{row['wall']:>8.2f}" + "".join(f"{row[k]:>10.2f}" for k in shown) + f"{sum(row[k] for k in shown):>8.2f}")
    print(f"{'all':16}{everything['wall']:>8.2f}" + "".join(f"{everything[k]:>10.2f}" for k in shown)
          + f"{sum(everything[k] for k in shown):>8.2f}")
    print(f"(the readings themselves cost this process {phases.sampling_cpu:.2f} CPU s, left out of python)")


def _short(kind: str) -> str:
    return {"node: Playwright driver": "driver", "chromium browser": "browser", "chromium gpu process": "gpu",
            "chromium renderer": "renderer", "chromium utility": "utility", "chromium zygote": "zygote"}.get(kind, kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="continuous_mlp", help="a bundled policy or an ONNX path")
    parser.add_argument("--targets", default="ort-web-*")
    parser.add_argument("--variants", default="fp32,fp16,int8")
    args = parser.parse_args()
    policy = Path(args.policy) if args.policy.endswith(".onnx") else POLICIES / f"{args.policy}.onnx"
    with tempfile.TemporaryDirectory(prefix="web-phases-") as scratch:
        cells = cells_of_a_run(policy, args.targets, args.variants, Path(scratch) / "report")
        import matrix.run.worker  # noqa: F401 — its imports before the first reading, as a worker's start

        phases = PhaseCpu()
        instrument(phases)
        serve(cells, phases)
    print_breakdown(phases)


if __name__ == "__main__":
    main()
