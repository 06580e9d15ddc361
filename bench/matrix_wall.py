"""Where the wall time of a full `policy-matrix run` goes, per target and per stage.

Runs the real CLI (a subprocess, exactly as a user does) on bundled example
policies and reads back what the run left: each cell worker's timeline
(wall-clock start of every stage, in measurement.json), the reference job's
files and the report's. Prints, per target, the seconds of each stage summed
over its variants, then the run's own steps (CLI start-up with model load and
observations, reference, variants, cells, report), with their sum against the
measured wall time: what is not inside a named stage shows as "unaccounted". A stage's seconds are
its own work; the waits for the stage gate (latency and cold start run alone) are a column of their own.
Then the CPU seconds of the run's process tree by process kind, and the wall they imply: the CPU over
the cores, the timed stages (which run alone), and both together — so whether a wall goal is reachable
is measured, not argued.

    .venv/bin/python bench/matrix_wall.py                                   # continuous MLP, every target
    .venv/bin/python bench/matrix_wall.py --policies pixel_cnn --targets 'ort-*,tract'
    .venv/bin/python bench/matrix_wall.py --json before.json                # keep the numbers to compare later

Targets run side by side (matrix.run.orchestrate.CellSchedule), so the per-target sums add up to more
than the "cells" step, and a stage's seconds include the wait for the next stage's turn (latency
runs alone). The machine's load changes every number: run it twice and compare like with like.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil  # the dev extra's; it reads the run's process tree
from matrix.run import guarded
from matrix.run.protocol import MEASUREMENT_FILE, SPEC_FILE, STAGES, Measurement

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "matrix" / "example_policies"
CELL_STAGES = ("start", *STAGES, "between cells")
GATE_WAIT = "gate wait"


class TreeUsage:
    """Peak memory and CPU seconds of a run's process tree, sampled every 0.1 s.

    Memory is summed over the processes alive at each sample: [RSS, PSS]. RSS counts a page shared by several
    processes (a library, what forked workers share with the fork server) once per process; PSS divides it
    among them, so its sum is what the tree holds. CPU is each process's last sampled user + system seconds,
    by kind (what a process spent after its last sample, at most 0.1 s of it, is missed: getrusage cannot
    stand in, as most of the tree is not reaped by the run's own processes)."""

    def __init__(self):
        self.peak_rss = self.peak_pss = 0
        self.cpu: dict[tuple, tuple[str, float]] = {}  # (pid, create time) -> (kind, CPU s)

    def sample(self, root: psutil.Process) -> None:
        rss = pss = 0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                with process.oneshot():
                    memory = process.memory_full_info()
                    times = process.cpu_times()
                    key = (process.pid, process.create_time())
                    kind = self.cpu[key][0] if key in self.cpu else process_kind(process.name(), process.cmdline())
                rss, pss = rss + memory.rss, pss + memory.pss
                self.cpu[key] = (kind, times.user + times.system)
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    @property
    def cpu_total(self) -> float:
        return sum(seconds for _, seconds in self.cpu.values())

    def by_kind(self) -> dict[str, float]:
        kinds: collections.Counter = collections.Counter()
        for kind, seconds in self.cpu.values():
            kinds[kind] += seconds
        return dict(kinds.most_common())


def process_kind(name: str, command: list[str]) -> str:
    line = " ".join(command)
    if "chrom" in name or "chrom" in (command[0] if command else ""):
        kind = next((label for flag, label in (("--type=renderer", "renderer"), ("--type=gpu-process", "gpu process"),
                                                 ("--type=utility", "utility"), ("--type=zygote", "zygote")) if flag in line), "browser")
        return f"chromium {kind}"
    if name.startswith("node"):  # the driver names its main thread: node-MainThread
        return "node: Playwright driver" if "playwright" in line else "node: ort-node"
    return "python" if name.startswith("python") else name


def run_matrix(policy: Path, targets: str, variants: str, extra: list[str], out: Path) -> tuple[float, float, TreeUsage]:
    """When the run started and ended, and what its process tree (runner, fork server, reference, tool steps,
    workers, browser) used. The end is read when the runner has exited, before the sampler's last pause
    (up to 0.1 s) ends: that pause is no part of the run's "exit" step."""
    command = [sys.executable, "-m", "matrix", "-q", "run", str(policy), "--out", str(out), "--targets", targets,
               "--variants", variants, "--fail-on", "never", *extra]
    usage = TreeUsage()
    started = time.time()
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as process:
        root = psutil.Process(process.pid)
        sampler = threading.Thread(target=sample_while, daemon=True, args=(
            usage, root, lambda: root.is_running() and root.status() != psutil.STATUS_ZOMBIE))
        sampler.start()
        stderr = process.stderr.read()
        process.wait()
        ended = time.time()
        sampler.join()
    if process.returncode != 0:
        sys.exit(f"policy-matrix run failed ({process.returncode}): {stderr.strip()[-2000:]}")
    return started, ended, usage


def sample_while(usage: TreeUsage, root: psutil.Process, running: Callable[[], bool]) -> None:
    """`usage.sample(root)` every 0.1 s while `running()` (bench/browser_sharing.py samples its own tree too)."""
    with contextlib.suppress(psutil.Error):  # the root ended between two samples
        while running():
            usage.sample(root)
            time.sleep(0.1)


def mtime(path: Path) -> float | None:
    return path.stat().st_mtime if path.exists() else None


def cell_stages(cell_dir: Path, next_start: float | None) -> tuple[dict[str, float], float, float]:
    """Seconds per stage of one cell (its own work: the gate waits that fell in it are under GATE_WAIT),
    the seconds it was timed alone (latency, and cold start but on an emulated device), and when it finished."""
    measurement = Measurement.read(cell_dir)
    timeline = measurement.timeline
    handed = mtime(cell_dir / SPEC_FILE)
    ends = [(name, at) for name, at in timeline.items() if name in CELL_STAGES]
    finished = timeline.get("finished", mtime(cell_dir / MEASUREMENT_FILE))
    seconds = {"start": (ends[0][1] if ends else finished) - handed}
    for (name, at), (_, following) in zip(ends, [*ends[1:], ("finished", finished)]):
        seconds[name] = following - at
    for name, waited in measurement.gate_wait_s.items():
        seconds[name] -= waited
        seconds[GATE_WAIT] = seconds.get(GATE_WAIT, 0.0) + waited
    if next_start is not None:
        seconds["between cells"] = next_start - finished
    cold_start_alone = measurement.cold_start_ms and not (measurement.backend and measurement.backend.emulated)
    timed = seconds.get("latency", 0.0) + (measurement.cold_start_ms / 1e3 if cold_start_alone else 0.0)
    return seconds, timed, finished


def account(out: Path, started: float, ended: float) -> tuple[dict[str, dict[str, float]], dict[str, float], float]:
    results = json.loads((out / "results.json").read_text())
    ran = [(c["target"], c["variant"]) for c in results["cells"] if (out / "cells" / f"{c['target']}-{c['variant']}").is_dir()]
    dirs = [out / "cells" / f"{target}-{variant}" for target, variant in ran]
    handovers = [mtime(d / "spec.json") for d in dirs]
    per_target: dict[str, dict[str, float]] = {}
    finishes, timed = [], 0.0
    for index, ((target, _), cell_dir) in enumerate(zip(ran, dirs)):
        # targets run side by side: "between cells" is the gap to the same target's next cell
        following = next((handovers[j] for j in range(index + 1, len(ran)) if ran[j][0] == target), None)
        seconds, cell_timed, finished = cell_stages(cell_dir, following)
        finishes.append(finished)
        timed += cell_timed
        row = per_target.setdefault(target, {})
        for name, value in seconds.items():
            row[name] = row.get(name, 0.0) + value
    last_finished = max(finishes, default=None)
    reference_start = mtime(out / "reference" / guarded.SPEC_FILE)
    reference_end = mtime(out / "reference" / guarded.RESULT_FILE)
    first_cell = min(handovers) if handovers else reference_end
    report_written = mtime(out / "index.html")
    run_steps = {
        "cli start, model, observations": reference_start - started,
        "reference and variants (own processes)": reference_end - reference_start,
        "services": first_cell - reference_end,
        "cells": (last_finished or first_cell) - first_cell,
        "report": report_written - (last_finished or first_cell),
        "exit": ended - report_written,
    }
    return per_target, run_steps, timed


def print_tables(policy: str, wall: float, usage: TreeUsage, per_target, run_steps, timed: float) -> None:
    shown = [name for name in (*CELL_STAGES, GATE_WAIT) if any(name in row for row in per_target.values())]
    print(f"\n== {policy}: wall {wall:.1f} s, peak memory of the run's processes: RSS {usage.peak_rss / 2**30:.2f} GiB, "
          f"PSS {usage.peak_pss / 2**30:.2f} GiB ==")
    print(f"{'target':<18}" + "".join(f"{name:>14}" for name in shown) + f"{'total':>10}")
    for target, row in per_target.items():
        print(f"{target:<18}" + "".join(f"{row.get(name, 0.0):>14.2f}" for name in shown) + f"{sum(row.values()):>10.2f}")
    totals = {name: sum(row.get(name, 0.0) for row in per_target.values()) for name in shown}
    print(f"{'all targets':<18}" + "".join(f"{totals[name]:>14.2f}" for name in shown) + f"{sum(totals.values()):>10.2f}")
    print()
    for name, value in run_steps.items():
        print(f"  {name:<40}{value:>8.2f} s")
    print(f"  {'sum of steps':<40}{sum(run_steps.values()):>8.2f} s   (wall {wall:.2f} s, "
          f"unaccounted {wall - sum(run_steps.values()):.2f} s)")
    print_floor(wall, usage, timed)


def print_floor(wall: float, usage: TreeUsage, timed: float) -> None:
    """The run's CPU by process kind and the walls it rules out on this machine's cores."""
    cores = len(os.sched_getaffinity(0))
    print(f"\n  CPU of the run's processes: {usage.cpu_total:.1f} s ("
          + ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in usage.by_kind().items()) + ")")
    alone = timed + max(0.0, usage.cpu_total - timed) / cores
    print(f"  floor on {cores} cores: CPU / cores {usage.cpu_total / cores:.1f} s; timed stages, run alone (latency, "
          f"cold start) {timed:.1f} s; the two with the timed work keeping one core busy {alone:.1f} s   (wall {wall:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="continuous_mlp", help="bundled policies, comma-separated "
                        f"({', '.join(p.stem for p in sorted(POLICIES.glob('*.onnx')))}) or ONNX paths")
    parser.add_argument("--targets", default="all")
    parser.add_argument("--variants", default="fp32,fp16,int8")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--keep", type=Path, help="keep each run's report folder here (DIR/POLICY), e.g. for bench/same_outputs.py")
    parser.add_argument("extra", nargs="*", help="more `policy-matrix run` options, after --")
    args = parser.parse_args()
    recorded = {}
    for name in args.policies.split(","):
        policy = Path(name) if name.endswith(".onnx") else POLICIES / f"{name}.onnx"
        with tempfile.TemporaryDirectory(prefix="matrix-wall-") as scratch:
            out = args.keep / policy.stem if args.keep else Path(scratch) / "report"
            started, ended, usage = run_matrix(policy, args.targets, args.variants, args.extra, out)
            per_target, run_steps, timed = account(out, started, ended)
        print_tables(policy.stem, ended - started, usage, per_target, run_steps, timed)
        recorded[policy.stem] = {"wall_s": ended - started, "peak_rss_bytes": usage.peak_rss, "peak_pss_bytes": usage.peak_pss,
                                 "cpu_s": usage.cpu_total, "cpu_s_by_kind": usage.by_kind(), "timed_s": timed,
                                 "targets": per_target, "run": run_steps}
    if args.json:
        args.json.write_text(json.dumps(recorded, indent=2))


if __name__ == "__main__":
    main()
