"""One run: model -> observations -> reference -> cells -> results -> report.

The cells of one target share a worker process (cells.WorkerProcess), and a cell that
kills it costs only itself: the target's next cell gets a fresh one. Several
targets' workers run at once (CellSchedule), but latency is measured with
nothing else running (cells.StageGate): a shared 2-core machine gives honest
latency only that way. Every finished cell is appended to results.jsonl at
once, so a run that is killed keeps what it measured.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import importlib
import json
import os
import platform
import sys
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, Field

import targets as registry
from targets import versions
from targets.base import RunService, Target

from .. import __version__, outdir, userfiles, validated
from . import action_range, cells, forkserver, grid, guarded, isolation, rollouts, variants
from ..inputs import batch_axes, graph_facts, observations, observation_sources
from ..decide import decide
from ..reference import reference, reference_job
from ..errors import InputError, Terminated
from ..errors import console_text as escape
from ..inputs.lint import candidate_precisions, lint, reference_bounds
from ..inputs.model import ModelInfo
from .. import options
from ..options import default_memory_limit
from ..judge.judge import Evidence, Judge
from .protocol import SERVICE, STAGES, UNTIMED, CellInputs, CellSpec
from ..outdir import write_atomic
from ..reference.reference import Reference
from ..configuration import Configuration, settings_label
from ..results import Cell, Host, Interruption, LintResult, RunResults, append_jsonl, renamed, upgrade_v1_cell
from ..judge.rules import DEFAULT_MIN_AGREEMENT, DEFAULT_TIE_MARGIN, ReturnTolerance, Tolerances

if TYPE_CHECKING:  # imported where they are used, after the reference job was asked for (or with --source only)
    from rich.console import Console
    from rich.progress import Progress

    from ..reference import source


@dataclass
class RunConfig:
    model: ModelInfo
    targets: list[str]
    variants: list[str]
    out: Path
    observations: Path | None = None
    n_obs: int = options.DEFAULT_N_OBS
    seed: int = options.DEFAULT_SEED
    batch_sizes: list[int] = field(default_factory=lambda: list(options.DEFAULT_BATCH_SIZES))
    warmup: int = options.DEFAULT_WARMUP
    iters: int = options.DEFAULT_ITERS
    threads: int = options.DEFAULT_THREADS
    timeout_s: float = options.DEFAULT_TIMEOUT_S
    tolerances: Tolerances = field(default_factory=Tolerances)
    host_label: str = ""
    tie_margin: float = DEFAULT_TIE_MARGIN
    min_agreement: float = DEFAULT_MIN_AGREEMENT
    memory_limit: int = field(default_factory=default_memory_limit)  # bytes of private memory per worker (RLIMIT_DATA)
    resume: bool = False  # keep the finished cells of the run recorded in `out`
    rollout: rollouts.RolloutPlan | None = None  # --env / --trajectory: behaviour in the loop
    return_tolerance: ReturnTolerance = field(default_factory=ReturnTolerance)
    diagnose: bool = False  # first divergent node of drifting cells (matrix/assist/diagnose.py)
    assist: bool = False  # graph preparations tried on failing cells (matrix/assist/preparations.py)
    candidates: list[ModelInfo] = field(default_factory=list)  # --candidate: same interface, judged against `model`
    settings_grid: grid.Grid = field(default_factory=lambda: grid.Grid({}))  # --settings: runtime knobs per target
    batch_axes_given: dict[str, int] = field(default_factory=dict)  # --batch-axis (model.batch_axes holds the result)
    source: source.SourceSpec | None = None  # --source: the policy in its training framework, one more column
    required: list[str] = field(default_factory=list)  # --require: targets that must run (not only SKIP)
    decision: decide.Request = field(default_factory=decide.Request)  # --budget / --prefer: what to ship per target
    side_inputs: observations.Feeds = field(default_factory=dict)  # --side-input: inputs fed whole, their given values

    @property
    def observation_source(self) -> observation_sources.ObservationSource:
        return observation_sources.choose(self.observations, self.rollout, self.model, self.seed, self.side_inputs)

    def judge(self) -> Judge:
        """The run's one Judge: every cell, fix attempt, candidate and release is judged by it."""
        models = [("", self.model), *((c.path.name, c) for c in self.candidates)]
        precisions = {name: graph_facts.computes_in(model.proto)[0] for name, model in models}
        per_call = frozenset(name for name, model in models if variants.quantization(model.proto)["per_call_ops"])
        return Judge(self.tolerances, self.tie_margin, self.min_agreement, self.return_tolerance, self.observation_source,
                     precisions, per_call)

    @property
    def limits(self) -> guarded.Limits:
        """What bounds every process that touches the model: cells, the reference and the tool's own steps."""
        return guarded.Limits(self.timeout_s, self.memory_limit)


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


# How soon the main thread acts on a signal the kernel gave another thread: Python runs a handler in the main thread
# only, when it next runs, and a process-directed SIGTERM or Ctrl-C may land on any thread (a cell's, a relay's) and
# then wakes nothing that waits without a timeout (a run went on for 192 s, until its worker's cells ended).
SIGNAL_CHECK_S = 0.5
RUN_FILE = "run.json"  # the run id and what a resumed run must match
LOCK_FILE = outdir.LOCK_FILE


@contextlib.contextmanager
def lock_out(out: Path):
    """One run (or merge) per report folder: a second one is told who holds it instead of interleaving;
    a folder with links planted where the tool writes is refused first (matrix.outdir). The lock is flock(2) on
    the lock file, which is what filelock's Unix lock is, written out here: importing filelock (~6 ms) was on
    every run's way to its reference job, for this one call. Closing the file releases it."""
    outdir.check_owned(out)
    lock = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another policy-matrix run is writing to {out} (lock {out / LOCK_FILE}); "
                             "wait for it or choose another --out") from None
        yield
    finally:
        os.close(lock)


def run(config: RunConfig, console: Console) -> RunResults:
    forkserver.CLIENT.warm()  # `policy-matrix run` started it before parsing (cli.py); other callers start it here
    forkserver.resume_collection()  # paused by the entry point while the run's modules were imported
    config.out.mkdir(parents=True, exist_ok=True)
    model = config.model
    identity = run_identity(config)
    run_id, finished = resume_state(config.out, identity) if config.resume else (uuid.uuid4().hex[:12], {})
    write_atomic(config.out / RUN_FILE, json.dumps({"run_id": run_id, **identity}, indent=2))
    judge = config.judge()  # once: every cell, fix attempt, candidate and release is judged by it
    obs_source = judge.observations
    obs_path = config.out / "observations.npz"
    batched = batch_axes.batched(model)
    symbolic = bool(batched) and all(batch_axes.is_symbolic(spec, model.batch_axes) for spec in batched)
    chunk = 0 if symbolic else observations.batch_multiple(model)
    if not obs_source.sampled_by_reference:  # visited states are sampled in the reference job, after its rollout
        observations.save(_observation_set(config, obs_source), obs_path)

    _announce_reference_rollout(config, console)
    gate = cells.StageGate()  # the cells' stages, and the runner's untimed work beside them
    imports: list[threading.Thread] = []

    def import_while_it_runs() -> None:
        imports.append(_import_untimed(gate, (QUIET_CONSOLE_MODULES if console.quiet else CONSOLE_MODULES) + LATER_MODULES))

    with ThreadPoolExecutor(max_workers=1) as pool:  # the variants need no reference: made while it runs
        made = pool.submit(_all_variants, config)
        ref, dev_runtime, ref_rollout = _isolated_reference(config, obs_path, chunk, obs_source, console,
                                                            import_while_it_runs)
        wait_first({made})
        (onnx_variants, variant_errors), candidate_variants = made.result()
    feeds = observations.read(obs_path)
    console.print(f"[bold]observations[/]: {escape(obs_source.describe(observations.count(feeds, model.batch_axes)))}", highlight=False)
    reference.save(ref, config.out / "reference.npz")
    failed, not_made = variants.split_errors(variant_errors)
    for variant, error in failed.items():
        console.print(f"[red]the tool could not make the {variant} variant[/] (its cells are SKIP): {escape(error)}")
    for variant, why in not_made.items():
        console.print(f"[bold]{variant} variant[/] {escape(why)}", highlight=False)
    template = CellInputs(
        observations=str(obs_path.resolve()),
        onnx_variants={k: str(v) for k, v in onnx_variants.items()}, variant_errors=variant_errors,
        batch_sizes=config.batch_sizes if symbolic else [chunk or 1], symbolic_batch=symbolic, chunk=chunk,
        warmup=config.warmup, iters=config.iters, threads=config.threads, batch_axes=model.batch_axes,
        rollout=config.rollout.as_dict() if config.rollout else None,
    )
    inputs_by_model = {"": template, **_candidate_inputs(template, candidate_variants)}
    results = _empty_results(config, feeds, template, judge, ref)
    results.variant_errors = {v: e for v, e in failed.items() if v in config.variants}
    results.variants_not_made = {v: why for v, why in not_made.items() if v in config.variants}
    if config.rollout:
        results.run_options["rollout"] = config.rollout.describe()
        if not config.rollout.open_loop:  # a replay has no returns: the rule it was not judged by is not recorded
            results.run_options["rollout"] |= {"return_tolerance": config.return_tolerance.describe(),
                                               "return_rule": "paired per-seed return differences, Student's t interval of the mean"}
        action_range.add_to(results, config.model, config.rollout, ref_rollout)
    results.run_options["run_id"] = run_id
    configurations = _configurations(config)
    results.grid = _grid_record(config, len(configurations))
    _print_grid(config, len(configurations), console)
    install_releases(config.targets, console)
    jsonl = Journal(config.out / "results.jsonl", run_id, model.sha256, console)
    if finished:
        console.print(f"[bold]resume[/]: keeping {len(finished)} finished cells of run {run_id}")
    services = Services(config.out)
    evidence = Evidence(config.model, ref, dev_runtime, ref_rollout, config.rollout)
    try:
        if config.source:  # first: its returns are the top row of Behaviour
            for thread in imports:  # the column's timing is not gated: nothing of the runner's runs beside it
                thread.join()
            results.run_options["source"] = config.source.describe()
            results.cells.append(_source_cell(config, results.hosts[0].label, obs_path, chunk, judge, evidence, console))
            jsonl.append(results.cells[-1])
        with _progress(console) as progress:
            runner = CellRunner(config, results.hosts[0].label, judge, evidence, services, progress, gate)
            schedule = CellSchedule(config, configurations, runner, inputs_by_model, finished, jsonl, gate)
            try:
                schedule.run()
            finally:
                results.cells.extend(schedule.cells_in_grid_order())
        from ..assist import assist  # loaded beside the reference job (LATER_MODULES), not on the way to it

        # Diagnosis and fix attempts are judged on parity: they carry no rollout plan (no episodes driven for nothing).
        context = assist.AssistContext(config.model, template, judge,
                                       Evidence(config.model, ref, dev_runtime), config.out, config.limits, services.env_for,
                                       {c.path.name: c for c in config.candidates})
        assist.after_cells(results, context, config.diagnose, config.assist, console)
    except KeyboardInterrupt as interrupt:  # keep what was measured: the report is written from the finished cells
        results.interrupted = Interruption(after_cells=len(results.cells),
                                           signal="SIGTERM" if isinstance(interrupt, Terminated) else "SIGINT")
        console.print(f"[yellow]interrupted[/]: writing the report of the {len(results.cells)} finished cells")
    finally:
        services.stop_all()
    return results


# What the runner needs after the reference job is imported while it only waits for the job and for its first cells,
# not on its way to asking for the job, nor after the last cell: the console and the cells' progress bars (rich, ~35
# ms; -q's console prints nothing and needs only the markup escaping of the lines it is given, errors.console_text),
# numpy.ma, which np.percentile (the judge's parity) imports on its first call (np.unique asks whether its input is
# masked; 5-50 ms), the assist step's modules (after_cells) and the report's (Jinja2, the charts; ~20 ms), in the
# order the runner needs them.
CONSOLE_MODULES = ("rich.console", "rich.progress")
QUIET_CONSOLE_MODULES = ("rich.markup",)
LATER_MODULES = ("numpy.ma", "matrix.assist.assist", "matrix.report.report")


def _import_untimed(gate: cells.StageGate, modules: tuple[str, ...]) -> threading.Thread:
    """`modules` imported in a thread of their own, from the moment the reference job runs: the runner goes on
    (it asks for its first cells) while the last ones load, and holds the gate's untimed grant meanwhile, so no
    cell's cold start or latency is timed beside them. A module that cannot load fails where it is used."""
    gate.acquire(UNTIMED)

    def load() -> None:
        try:
            for module in modules:
                with contextlib.suppress(Exception):
                    importlib.import_module(module)
        finally:
            gate.release(UNTIMED)

    thread = threading.Thread(target=load, name="imports", daemon=True)
    thread.start()
    return thread


def _source_cell(config: RunConfig, host: str, obs_path: Path, chunk: int, judge: Judge, evidence: Evidence,
                 console: Console) -> Cell:
    """The source column (matrix/reference/source.py), judged by the run's Judge like every cell."""
    from ..reference import source  # only with --source: a plain run does not import it on the way to its reference job

    inputs = source.ColumnInputs(config.model, obs_path, chunk, config.warmup, config.iters, config.timeout_s,
                                 config.memory_limit, config.rollout, config.side_inputs)
    judging = source.Judging(host, judge, evidence)
    console.print(f"[bold]source[/]: {escape(config.source.describe()['source'])} in {escape(config.source.python)}",
                  highlight=False)
    cell = source.run_column(config.source, inputs, judging, config.out / "source", lambda stage: None)
    console.print(f"cell source {escape(cell.variant)}: {cell.verdict} ({cell.duration_s:.1f} s)", highlight=False)
    return cell


def _candidate_inputs(template: CellInputs, candidate_variants: dict[str, tuple]) -> dict[str, CellInputs]:
    """Each candidate's cells share the run's inputs but its own ONNX variants."""
    return {name: replace(template, onnx_variants={k: str(v) for k, v in paths.items()}, variant_errors=errors)
            for name, (paths, errors) in candidate_variants.items()}


class CellSchedule:
    """Each target's cells in grid order in one worker process (cells.WorkerProcess), several targets at once: as
    many as the cores and the memory allow. Their stages are granted by one cells.StageGate, so opening
    sessions and pages, contract, parity, rollouts and placement run side by side while latency is measured
    with nothing else running. Each finished cell goes to the journal at once; the report lists them in
    grid order. Targets that share something large (a browser) share one worker, one target after another
    (Target.worker_group): the worker, its Playwright driver and its browser start once per run, not once per
    target, and one target's page is held at a time. An interrupted run kills the workers and keeps only the cells that finished."""

    def __init__(self, config: RunConfig, configurations: list[Configuration], runner: CellRunner, inputs_by_model: dict,
                 finished: dict, journal: Journal, gate: cells.StageGate):
        self.config, self.runner, self.inputs_by_model = config, runner, inputs_by_model
        self.kept, self.journal = finished, journal
        self.by_worker: dict[str, list[tuple[int, Configuration]]] = {}  # a worker's cells, in grid order
        for index, configuration in enumerate(configurations):
            group = registry.get(configuration.target_label).worker_group or configuration.target_label
            self.by_worker.setdefault(group, []).append((index, configuration))
        self.gate = gate
        self.done: dict[int, Cell] = {}
        self.recording = threading.Lock()
        self.workers: list[cells.WorkerProcess] = []
        self.interrupted = threading.Event()

    def run(self) -> None:
        slots = concurrent_targets(self.config.memory_limit)
        pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="target")
        # The workers with the most cells first (the browser targets' one): the run ends when its longest worker does.
        pending, running = sorted(self.by_worker, key=lambda worker: -len(self.by_worker[worker])), set()
        try:
            while pending or running:
                while pending and len(running) < slots:
                    running.add(pool.submit(self._run_cells, self.by_worker[pending.pop(0)]))
                for future in wait_first(running):
                    running.remove(future)
                    future.result()
        except BaseException:  # interrupted (or a bug): no stage is granted any more, no worker outlives the run
            self.interrupted.set()
            self.gate.close()
            for worker in list(self.workers):
                worker.abort()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _run_cells(self, items: list[tuple[int, Configuration]]) -> None:
        worker = cells.WorkerProcess(self.config.memory_limit, self.config.timeout_s * len(items), self.gate)
        self.workers.append(worker)
        try:
            for index, configuration in items:
                if self.interrupted.is_set():
                    return
                kept = self.kept.get(configuration.key)
                if kept is not None:
                    label = escape(configuration.label)
                    self.runner.progress.add_task(f"{label}: {kept.verdict} (kept)", total=1, completed=1, start=False)
                    log_finished(self.runner.progress, label, f"{kept.verdict} (kept)", kept.duration_s)
                    self._record(index, kept, new=False)
                else:
                    spec = self.inputs_by_model[configuration.candidate].for_cell(configuration, rollout=True)
                    self._record(index, self.runner.run(registry.get(configuration.target_label), spec, worker), new=True)
        finally:
            worker.stop()

    def _record(self, index: int, cell: Cell, new: bool) -> None:
        with self.recording:
            if self.interrupted.is_set():  # a cell cut short by the interruption is no result
                return
            if new:
                self.journal.append(cell)
            self.done[index] = cell

    def cells_in_grid_order(self) -> list[Cell]:
        return [self.done[index] for index in sorted(self.done)]


def wait_first(futures: set) -> set:
    """concurrent.futures.wait(FIRST_COMPLETED), woken every SIGNAL_CHECK_S so a signal's handler runs meanwhile."""
    while True:
        finished, _ = wait(futures, timeout=SIGNAL_CHECK_S, return_when=FIRST_COMPLETED)
        if finished:
            return finished


WORKER_FOOTPRINT = 1 << 30  # what one worker and its browser may hold at once (bench/matrix_wall.py measures the tree)


def concurrent_targets(memory_limit: int) -> int:
    """How many targets' workers run at once: one per core, fewer when the memory available would not
    hold that many workers at their cap (or their usual footprint, when the cap is larger)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    available = _available_memory()
    if available is None:
        return cores
    return max(1, min(cores, available // min(memory_limit, WORKER_FOOTPRINT)))


def _available_memory() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _configurations(config: RunConfig) -> list[Configuration]:
    """The grid in run order (target, candidate, variant, settings): deterministic, known before it starts."""
    candidates = ["", *(c.path.name for c in config.candidates)]
    return [Configuration.of(target, variant, candidate, knobs) for target in config.targets for candidate in candidates
            for variant in config.variants for knobs in config.settings_grid.for_target(target)]


def _grid_record(config: RunConfig, size: int) -> dict:
    return {"grid_version": 1, "configurations": size, "candidates": [c.path.name for c in config.candidates],
            "candidate_sha256": {c.path.name: c.sha256 for c in config.candidates}, **config.settings_grid.describe()}


def _print_grid(config: RunConfig, size: int, console: Console) -> None:
    axes = [_counted(len(config.targets), "target"), _counted(len(config.variants), "variant")]
    if config.candidates:
        axes.append(f"{1 + len(config.candidates)} models ({escape(', '.join(c.path.name for c in config.candidates))} "
                    f"judged against {escape(config.model.path.name)})")
    for target, combos in config.settings_grid.describe()["settings"].items():
        axes.append(f"{target} settings {' | '.join(settings_label(k) for k in combos)}")
    console.print(f"[bold]grid[/]: {_counted(size, 'configuration')}: {'; '.join(axes)}", highlight=False)
    for pruned in config.settings_grid.pruned:
        console.print(f"[dim]not run: {escape(pruned)} (that target has no such setting)[/]", highlight=False)


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def install_releases(labels: list[str], console: Console) -> None:
    """Pinned releases (`ort-cpu@1.20.1`) are installed before the first cell, said aloud: a first npm install
    takes tens of seconds, and one that cannot be installed is known before its cells SKIP."""
    for target in (registry.get(label) for label in labels):
        if versions.is_pinned(target) and target.unavailable_reason() is None:
            console.print(f"[bold]release[/]: {escape(target.name)}: {escape(_install(target, console))}", highlight=False,
                          soft_wrap=True)


def _install(target: Target, console: Console) -> str:
    """Install the release (a spinner on a terminal, a line before it otherwise); 'ready …' or why not."""
    release = versions.release_of(target)
    if release.installed(target.pinned_version) or versions.below_floor(target):
        return versions.install_problem(target) or "ready (installed before)"
    doing = f"installing {release.package} {target.pinned_version} from the package registry"
    started = time.monotonic()
    if console.is_terminal:
        with console.status(f"release: {escape(target.name)}: {doing}…"):
            problem = versions.install_problem(target)
    else:
        console.print(f"[bold]release[/]: {escape(target.name)}: {doing}…", highlight=False, soft_wrap=True)
        problem = versions.install_problem(target)
    return problem or f"ready (installed in {time.monotonic() - started:.0f} s)"


def run_identity(config: RunConfig) -> dict:
    """What a resumed run must share with the run it continues for its cells to belong together."""
    source = {"seed": config.seed, "n_obs": config.n_obs}
    if config.observations:
        try:
            source = {"observations_sha256": userfiles.sha256(Path(config.observations), "observation")}
        except OSError as error:
            raise InputError(f"{config.observations}: cannot read the observation file ({error.strerror or error})") from None
    elif config.observation_source.kind != observation_sources.SYNTHETIC:  # the rollout or trajectory the states come from
        source["observations_from"] = config.rollout.describe()
    return {
        "model_sha256": config.model.sha256,
        "settings": {
            **source, "targets": config.targets, "variants": config.variants, "batch_sizes": config.batch_sizes,
            "warmup": config.warmup, "iters": config.iters, "threads": config.threads, "timeout_s": config.timeout_s,
            "tolerances": config.tolerances.overrides, "host_label": config.host_label, "memory_limit": config.memory_limit,
            **_grid_identity(config),
        },
    }


def _grid_identity(config: RunConfig) -> dict:
    """Only the axes a run uses: a plain run resumes a run recorded before these axes existed."""
    identity = {}
    if config.batch_axes_given:
        identity["batch_axes"] = config.model.batch_axes
    if config.candidates:
        identity["candidates"] = [c.sha256 for c in config.candidates]
    if config.settings_grid.settings:
        identity["settings_grid"] = config.settings_grid.describe()["settings"]
    if config.side_inputs:
        identity["side_inputs"] = {name: value.tolist() for name, value in config.side_inputs.items()}
    return identity


def resume_state(out: Path, identity: dict) -> tuple[str, dict[tuple[str, ...], Cell]]:
    """The run id recorded in `out` and its finished cells, after checking they are comparable."""
    if not (out / RUN_FILE).exists():
        raise InputError(f"--resume {out}: no run to resume there ({RUN_FILE} missing)")
    recorded = validated.model(RunRecord, validated.json_file(out / RUN_FILE, "run record"), f"--resume {out / RUN_FILE}")
    if recorded.model_sha256 != identity["model_sha256"]:
        raise InputError(f"--resume {out}: that run measured another model (sha256 {recorded.model_sha256[:12]}…)")
    # A run recorded before `precisions` was called `variants` resumes like one recorded after.
    before, now = renamed(recorded.run_options, "precisions", "variants"), identity["settings"]
    changed = [key for key in now if before.get(key) != now[key]]
    if changed:
        key = changed[0]
        then = userfiles.one_line(repr(before.get(key)), 100)
        raise InputError(f"--resume {out}: options differ from that run's ({key}: {then} then, {now[key]!r} now)")
    return recorded.run_id, Journal.finished(out / "results.jsonl", recorded.run_id, identity["model_sha256"])


class RunRecord(BaseModel):
    """run.json: what a resumed run must match (read back from a folder anyone may have edited)."""

    run_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    run_options: dict = Field({}, alias="settings")


class Journal:
    """results.jsonl: one line per finished cell, stamped with run id and model hash. Earlier
    runs' lines are kept (never silently deleted); a full disk costs the journal, not the run."""

    def __init__(self, path: Path, run_id: str, model_sha256: str, console: Console):
        self.path, self.stamp, self.console = path, {"run_id": run_id, "model_sha256": model_sha256}, console
        self.broken = False
        _drop_cut_line(path)
        earlier = {line.get("run_id") for line in _json_lines(path)} - {run_id}
        if earlier:
            console.print(f"[dim]{path.name} keeps the lines of {len(earlier)} earlier run(s); this run's lines carry run_id {run_id}[/]")

    def append(self, cell: Cell) -> None:
        try:
            append_jsonl(self.path, cell, **self.stamp)
        except OSError as error:
            if not self.broken:
                self.console.print(f"[yellow]cannot append to {escape(str(self.path))}[/]: {escape(str(error))}; the report will still hold every cell")
            self.broken = True

    @staticmethod
    def finished(path: Path, run_id: str, model_sha256: str) -> dict[tuple[str, ...], Cell]:
        """This run's finished cells by Configuration.key."""
        found = {}
        for line in _json_lines(path):
            if line.get("run_id") == run_id and line.get("model_sha256") == model_sha256:
                with contextlib.suppress(ValueError, RecursionError):  # not a cell (edited, or nested too deep)
                    cell = Cell.model_validate(upgrade_v1_cell(line))
                    if not cells.failed_on_tool_io(cell):  # a full disk is no verdict: run it again
                        found[cell.configuration.key] = cell
        return found


def _drop_cut_line(path: Path) -> None:
    """A line cut short (a full disk, a kill mid-write) is dropped, so the next line is not glued onto it
    and lost too; its cell is not among the finished ones and runs again."""
    try:
        with path.open("rb+") as stream:
            data = stream.read()
            if data and not data.endswith(b"\n"):
                stream.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def _json_lines(path: Path) -> list[dict]:
    """Parsed lines; a line cut short by a kill is skipped."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    lines = []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError, RecursionError):  # a line cut short, or nested past parsing
            data = json.loads(raw)
            if isinstance(data, dict):
                lines.append(data)
    return lines


def _all_variants(config: RunConfig) -> tuple[tuple[dict[str, Path], dict[str, str]], dict[str, tuple]]:
    """The model's variants, and each candidate's by file name."""
    candidates = {c.path.name: _variants_of(c, config, f"candidate-{i}") for i, c in enumerate(config.candidates)}
    return _variants_of(config.model, config, "model"), candidates


def _variants_of(model: ModelInfo, config: RunConfig, slot: str) -> tuple[dict[str, Path], dict[str, str]]:
    """The model's ONNX variants, made under the run's --timeout and memory cap (see matrix.run.variants)."""
    return variants.produce_guarded(model, config.variants, config.out / "variants" / slot, config.limits)


def _isolated_reference(config: RunConfig, obs_path: Path, chunk: int, obs_source: observation_sources.ObservationSource, console,
                        on_started=lambda: None):
    """The reference, the development runtime's outputs and the reference's rollout in a guarded process (see
    matrix.reference.reference_job); with visited states as the source, the job samples them into `obs_path` first.
    `on_started`: called once the job runs (guarded.run_process)."""
    folder = config.out / "reference"
    folder.mkdir(exist_ok=True)
    for stale in ("reference.npz", "dev_runtime.npz", "rollout.npz"):
        (folder / stale).unlink(missing_ok=True)
    spec = {"model": str(config.model.path.resolve()), "batch_axes_given": config.batch_axes_given,
            "observations": str(obs_path.resolve()), "chunk": chunk,
            "rollout": config.rollout.as_dict() if config.rollout else None,
            "visited_states": {"count": config.n_obs, "multiple": chunk or 1} if obs_source.sampled_by_reference else None}
    answer, ending = guarded.attempt("reference", spec, folder, config.limits, on_started=on_started)
    report = answer or {}
    if "rollout_error" in report and obs_source.sampled_by_reference:  # no rollout: no visited states to judge on
        raise InputError(report["rollout_error"])
    if "error" in report or not (folder / "reference.npz").exists():
        reason = guarded.name_out_of_memory(report["error"], config.memory_limit) if "error" in report else ending.describe()
        raise InputError(f"the float64 reference of {config.model.path.name} could not be computed: {reason}")
    outputs, margins = reference_job.load(folder / "reference.npz")
    dev_runtime = reference_job.load(folder / "dev_runtime.npz")[0] if (folder / "dev_runtime.npz").exists() else None
    if dev_runtime is None:
        console.print(f"[yellow]ORT CPU fp32 (the development runtime) failed[/]: {escape(report.get('dev_runtime_error') or ending.describe())}")
    return Reference(outputs, margins), dev_runtime, _reference_rollout(config, folder, report, ending)


def _reference_rollout(config: RunConfig, folder: Path, report: dict, ending) -> rollouts.ReferenceRollout | None:
    if config.rollout is None:
        return None
    if "rollout_error" in report:
        raise InputError(report["rollout_error"])
    if "rollout" not in report:
        raise InputError(f"the float64 reference rollout of {config.model.path.name} did not finish: {ending.describe()}")
    return rollouts.reference_from(report["rollout"], observations.read(folder / "rollout.npz"))


def _observation_set(config: RunConfig, obs_source: observation_sources.ObservationSource) -> observations.Feeds:
    """The set the core makes itself: recorded or seeded (visited states and a trajectory's steps come from the
    reference job: their rows carry the recurrent state the reference fed), under the run's memory cap."""
    with isolation.capped_runner(config.memory_limit, f"making the observation set ({obs_source.kind})"):
        if obs_source.kind == observation_sources.RECORDED:
            return observations.load(config.observations, config.model, config.memory_limit, config.side_inputs)
        return {**observations.seeded(config.model, config.n_obs, config.seed), **config.side_inputs}  # the user's value


def _empty_results(config: RunConfig, feeds, template: CellInputs, judge: Judge, ref: Reference) -> RunResults:
    """The run's record before its cells: the model, host, options and lints (those known once the reference is:
    whether the model keeps the action bounds it states)."""
    size, obs_source = observations.count(feeds, template.batch_axes), judge.observations
    kept = reference_bounds(config.model, ref.outputs)
    return RunResults(
        tool_version=__version__,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        model={**config.model.summary(), "observations": size, "observation_source": obs_source.describe(size),
               "observation_kind": obs_source.kind, "observations_sha256": observation_sources.feeds_sha256(feeds),
               "inputs_fed_whole": batch_axes.fed_whole(config.model)},
        hosts=[host_info(config.host_label)],
        run_options={
            "batch_sizes": template.batch_sizes, "warmup": config.warmup, "iters": config.iters, "threads": config.threads,
            "targets": config.targets, "variants": config.variants, "timeout_s": config.timeout_s,
            **judge.run_options(),
        },
        lints=[LintResult(**vars(item)) for item in lint(config.model, config.side_inputs) + ([kept] if kept else [])
              + candidate_precisions(config.candidates)],
        cells=[],
    )


def _announce_reference_rollout(config: RunConfig, console: Console) -> None:
    """The float64 reference drives the same episodes (the behavioural ground truth), in the reference job."""
    plan = config.rollout
    if plan is None:
        return
    what = f"replay of {Path(plan.trajectory).name}" if plan.open_loop else f"{plan.episodes} episodes of {plan.env}"
    console.print(f"[bold]reference rollout[/]: float64 policy, {escape(what)}", highlight=False)


class CellRunner:
    """Runs and judges one cell at a time with what every cell of the run shares: the run's
    config, host, reference (and its rollout), the development runtime's outputs, services, progress."""

    def __init__(self, config: RunConfig, host: str, judge: Judge, evidence: Evidence, services: Services, progress: Progress,
                 gate: cells.StageGate):
        self.config, self.host, self.judge, self.evidence = config, host, judge, evidence
        self.services, self.progress = services, progress
        self.gate = gate  # cells run side by side (CellSchedule): judging is untimed work

    def run(self, target: Target, spec: CellSpec, worker: cells.WorkerProcess | None = None) -> Cell:
        label = escape(spec.configuration.label)
        reason = target.unavailable_reason() or target.variant_skip_reason(spec.variant) or versions.install_problem(target)
        if reason:
            self.progress.add_task(f"{label}: [dim]SKIP[/]", total=1, completed=1, start=False)
            cell = cells.skipped(host=self.host, target=target.name, variant=spec.variant, reason=reason,
                                 runtime_version=_version(target))
        else:
            task = self.progress.add_task(label, total=len(STAGES))
            outcome = self._execute(target, spec, worker, self._on_stage(task, label))
            with self.gate.untimed():
                cell = self._judge(target, spec, outcome)
            colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim", "CONVERTED": "blue"}[cell.verdict]
            self.progress.update(task, completed=len(STAGES), description=f"{label}: [{colour}]{cell.verdict}[/]")
        cell.candidate, cell.settings = spec.candidate, spec.settings
        log_finished(self.progress, label, cell.verdict, cell.duration_s)
        return cell

    def _on_stage(self, task, label: str):
        def on_stage(name: str) -> None:
            stage_name = name.split(" (")[0]  # "rollout (3/10 episodes)": progress within a stage
            if stage_name in STAGES:
                self.progress.update(task, completed=STAGES.index(stage_name), description=f"{label}: {name}")
        return on_stage

    def _execute(self, target: Target, spec: CellSpec, worker: cells.WorkerProcess | None, on_stage) -> cells.CellOutcome:
        try:
            env = self.services.env_for(target)
        except Exception as error:  # a service that cannot start costs its cells only
            return cells.CellOutcome.failed(SERVICE, f"{type(error).__name__}: {error}")
        cell_dir = self.config.out / "cells" / spec.configuration.dir_name
        return cells.execute(cell_dir, spec, env, self.config.timeout_s, on_stage, self.config.memory_limit, worker)

    def _judge(self, target: Target, spec: CellSpec, outcome: cells.CellOutcome) -> Cell:
        cell = self.judge.cell(outcome, self.evidence, host=self.host, target=target.name, variant=spec.variant,
                               predicts=target.predicts, candidate=spec.candidate)  # a pinned release's own keys first
        if spec.candidate:
            cell.notes.append(f"candidate: judged against {self.config.model.path.name}'s float64 reference")
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
        self.starting = threading.Lock()  # targets run side by side: one start per service, one install per release

    def env_for(self, target: Target) -> dict[str, str]:
        """What a worker of `target` needs: its service's endpoint, and a pinned release's environment."""
        with self.starting:
            return {**self._service_env(target), **versions.worker_env(target)}

    def _service_env(self, target: Target) -> dict[str, str]:
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


def _progress(console: Console) -> Progress | NoBars:
    """Live bars on a terminal. Elsewhere (a CI log) rich draws nothing until the run ends, so there are no
    bars there and `log_finished` prints one plain line per cell as it finishes instead."""
    if not console.is_terminal:
        return NoBars(console)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # loaded while the reference job ran

    return Progress(
        TextColumn("{task.description}", style="bold"), BarColumn(), TimeElapsedColumn(), console=console, transient=False,
    )


class NoBars:
    """The progress display off a terminal: the tasks rich.progress would draw are not kept (nor rich.progress imported)."""

    def __init__(self, console: Console):
        self.console = console

    def __enter__(self) -> NoBars:
        return self

    def __exit__(self, *exception) -> None:
        return None

    def add_task(self, description: str, **options) -> int:
        return 0

    def update(self, task: int, **options) -> None:
        return None


def log_finished(progress: Progress, label: str, verdict: str, duration_s: float) -> None:
    if not progress.console.is_terminal:
        progress.console.print(f"cell {label}: {verdict} ({duration_s:.1f} s)", highlight=False)
