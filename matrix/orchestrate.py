"""One run: model -> observations -> reference -> cells -> results -> report.

Cells run one after another (a shared 2-core machine gives honest latency only
that way), each in its own worker process; every finished cell is appended to
results.jsonl at once, so a run that is killed keeps what it measured.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import platform
import sys
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import targets as registry
from targets.base import RunService, Target

from . import __version__, assist, cells, observations, reference, variants
from .lint import lint
from .model import ModelInfo
from .results import Host, LintResult, RunResults, append_jsonl
from .verdict import Tolerances


@dataclass
class RunConfig:
    model: ModelInfo
    targets: list[str]
    precisions: list[str]
    out: Path
    observations: Path | None = None
    n_obs: int = 128
    seed: int = 0
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    warmup: int = 20
    iters: int = 200
    threads: int = 1
    timeout_s: float = 600.0
    tolerances: Tolerances = field(default_factory=Tolerances)
    host_label: str = ""
    diagnose: bool = False  # first divergent node of drifting cells (matrix/diagnose.py)
    assist: bool = False  # graph preparations tried on failing cells (matrix/preparations.py)


def host_info(label: str) -> Host:
    packages = {}
    for name in ("onnx", "onnxruntime", "numpy", "onnxconverter-common"):
        with contextlib.suppress(PackageNotFoundError):
            packages[name] = version(name)
    return Host(
        label=label or default_host_label(),
        os=f"{platform.system()} {platform.release()}",
        arch=platform.machine(),
        cpu=_cpu_name(),
        python=sys.version.split()[0],
        packages=packages,
    )


def default_host_label() -> str:
    return f"{platform.system().lower()}-{platform.machine().lower()}"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run(config: RunConfig, console: Console) -> RunResults:
    config.out.mkdir(parents=True, exist_ok=True)
    model = config.model
    feeds = _observation_set(config)
    obs_path = config.out / "observations.npz"
    observations.save(feeds, obs_path)
    symbolic = all(spec.batch_is_symbolic for spec in model.inputs)
    chunk = 0 if symbolic else observations.batch_multiple(model)

    console.print(f"[bold]reference[/]: float64 evaluation of {observations.count(feeds)} observations")
    ref = reference.compute(model, feeds, chunk)
    base = _baseline(model, feeds, chunk, console)
    onnx_variants, variant_errors = variants.produce_all(model, config.precisions)
    template = cells.CellSpec(
        target="", variant="", observations=str(obs_path.resolve()),
        onnx_variants={k: str(v) for k, v in onnx_variants.items()}, variant_errors=variant_errors,
        batch_sizes=config.batch_sizes if symbolic else [chunk], symbolic_batch=symbolic, chunk=chunk,
        warmup=config.warmup, iters=config.iters, threads=config.threads,
    )
    results = _empty_results(config, feeds, template)
    jsonl = config.out / "results.jsonl"
    jsonl.unlink(missing_ok=True)
    services = Services(config.out)
    try:
        with _progress(console) as progress:
            for target_name in config.targets:
                for variant in config.precisions:
                    spec = replace(template, target=target_name, variant=variant)
                    cell = _one_cell(registry.get(target_name), spec, config, results.hosts[0].label, ref, base, services, progress)
                    append_jsonl(jsonl, cell)
                    results.cells.append(cell)
        context = assist.AssistContext(config.model, template, ref, base, config.out, config.timeout_s, services.env_for)
        assist.after_cells(results, context, config.diagnose, config.assist, console)
    except KeyboardInterrupt:  # keep what was measured: the report is written from the finished cells
        results.settings["interrupted_after_cells"] = len(results.cells)
        console.print(f"[yellow]interrupted[/]: writing the report of the {len(results.cells)} finished cells")
    finally:
        services.stop_all()
    return results


def _observation_set(config: RunConfig) -> observations.Feeds:
    if config.observations:
        return observations.load(config.observations, config.model)
    return observations.seeded(config.model, config.n_obs, config.seed)


def _empty_results(config: RunConfig, feeds, template: cells.CellSpec) -> RunResults:
    source = str(config.observations or f"seeded (seed {config.seed})")
    return RunResults(
        tool_version=__version__,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        model={**config.model.summary(), "observations": observations.count(feeds), "observation_source": source},
        hosts=[host_info(config.host_label)],
        settings={
            "batch_sizes": template.batch_sizes, "warmup": config.warmup, "iters": config.iters, "threads": config.threads,
            "targets": config.targets, "precisions": config.precisions, "timeout_s": config.timeout_s,
            "tolerances": config.tolerances.overrides,
        },
        lints=[LintResult(**vars(item)) for item in lint(config.model)],
        cells=[],
    )


def _baseline(model, feeds, chunk, console):
    try:
        return reference.baseline(model, feeds, chunk)
    except Exception as error:  # the matrix still runs; that column stays empty
        console.print(f"[yellow]ORT CPU fp32 baseline failed[/]: {error}")
        return None


def _one_cell(target: Target, spec: cells.CellSpec, config, host, ref, base, services, progress):
    variant = spec.variant
    label = f"{target.name} {variant}"
    reason = target.unavailable_reason() or target.variant_skip_reason(variant)
    if reason:
        progress.add_task(f"{label}: [dim]SKIP[/]", total=1, completed=1, start=False)
        return cells.skipped(host=host, target=target.name, variant=variant, reason=reason, runtime_version=_version(target))
    task = progress.add_task(label, total=len(cells.STAGES))

    def on_stage(name: str) -> None:
        if name in cells.STAGES:
            progress.update(task, completed=cells.STAGES.index(name), description=f"{label}: {name}")

    try:
        env = services.env_for(target)
    except Exception as error:  # a service that cannot start costs its cells only
        outcome = cells.CellOutcome({"error": {"stage": "service", "message": f"{type(error).__name__}: {error}"}}, {}, 0.0)
    else:
        cell_dir = config.out / "cells" / f"{target.name}-{variant}"
        outcome = cells.execute(cell_dir, spec, env, config.timeout_s, on_stage)
    cell = cells.judge(
        outcome, host=host, target=target.name, variant=variant, predicts=target.predicts, model=config.model,
        reference=ref, baseline=base, tolerance=config.tolerances.get(target.name, variant),
    )
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim"}[cell.verdict]
    progress.update(task, completed=len(cells.STAGES), description=f"{label}: [{colour}]{cell.verdict}[/]")
    return cell


def _version(target: Target) -> str:
    try:
        return target.runtime_version()
    except Exception:  # an absent runtime has no version to report
        return ""


class Services:
    """Run-scoped services (e.g. one browser), started on first use, restarted if dead."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.running: dict[str, RunService] = {}

    def env_for(self, target: Target) -> dict[str, str]:
        key = target.service_key
        if key is None:
            return {}
        service = self.running.get(key)
        if service is None or not service.alive():
            if service is not None:
                service.stop()
            service = target.start_service(self.run_dir)
            self.running[key] = service
        return service.env() if service else {}

    def stop_all(self) -> None:
        for service in self.running.values():
            with contextlib.suppress(Exception):
                service.stop()


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}", style="bold"), BarColumn(), TimeElapsedColumn(), console=console, transient=False
    )
