"""The `policy-matrix` command line."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import targets as registry
from targets.base import VARIANTS

from . import __version__, options
from . import model as model_loader
from . import results as schema
from .compare import Thresholds
from .compare import compare as compare_results
from .errors import InputError
from .lint import lint as lint_model
from .merge import merge as merge_shards
from .merge import shard_path as merge_shard_path
from .orchestrate import RunConfig, Terminated, lock_out, raise_terminated
from .orchestrate import run as run_matrix
from .report import write_all
from .verdict import Tolerances


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="policy-matrix")
def app() -> None:
    """Run one exported policy on every runtime it ships on: parity drift against a
    float64 reference, latency, operator placement and the RL action contract."""


console = Console(stderr=True)
FAIL_ON = ("fail", "warn", "skip", "never")
FAIL_ON_OPTION = click.option(
    "--fail-on", type=click.Choice(FAIL_ON), default="fail", show_default=True,
    help="Exit 1 when a cell is at least this bad (skip: a FAILed or SKIPped cell)."
)
BASELINE_OPTION = click.option(
    "--baseline", type=click.Path(path_type=Path), help="Earlier results.json to flag regressions against (exit 1 if any)."
)
LATENCY_THRESHOLD_OPTION = click.option(
    "--latency-threshold", default=0.25, show_default=True, help="p50 slowdown (fraction) that counts as a regression."
)
DRIFT_FACTOR_OPTION = click.option(
    "--drift-factor", default=10.0, show_default=True, help="Drift growth factor that counts as a regression."
)


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _ints(value: str, option: str) -> list[int]:
    try:
        numbers = [int(item) for item in _csv(value)]
    except ValueError:
        raise InputError(f"{option} {value!r}: expected comma-separated integers, e.g. 1,64") from None
    if not numbers or min(numbers) < 1:
        raise InputError(f"{option} {value!r}: batch sizes must be positive")
    return numbers


def _target_names(value: str) -> list[str]:
    names = list(registry.REGISTRY) if value == "all" else _csv(value)
    unknown = [name for name in names if name not in registry.REGISTRY]
    if unknown:
        raise InputError(f"unknown target {unknown[0]!r}; known: {', '.join(registry.REGISTRY)}")
    return names


def _precisions(value: str) -> list[str]:
    names = _csv(value)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise InputError(f"unknown precision {(unknown or [value])[0]!r}; known: {', '.join(VARIANTS)}")
    return names


def _config_tolerances(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    table = options.config_table(options.read_toml(path), "tolerance", path)
    return {key: options.tolerance_value(value, f"{path}: [tolerance] {key!r}") for key, value in table.items()}


def _tolerances(specs: list[str], config: Path | None) -> Tolerances:
    """Every override is a number >= 0 whose key matches some target or precision."""
    tolerances = Tolerances.parse(specs, _config_tolerances(config))
    for key, value in tolerances.overrides.items():
        where = f"tolerance {key!r}"
        options.tolerance_value(value, where)
        options.tolerance_key(key, list(registry.REGISTRY), VARIANTS, where)
    return tolerances


@app.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--targets", default="all", show_default=True, help="Comma-separated target names, or 'all'.")
@click.option("--precisions", default="fp32,fp16,int8", show_default=True, help="Comma-separated variants: fp32, fp16, int8.")
@click.option("--obs", type=click.Path(path_type=Path), help="Recorded observations (.npy for one input, .npz keyed by input name).")
@click.option("--n-obs", default=128, show_default=True, help="Size of the seeded observation set when --obs is not given.")
@click.option("--seed", default=0, show_default=True, help="Seed of the generated observation set.")
@click.option("--batch-sizes", default="1,64", show_default=True, help="Batch sizes to time.")
@click.option("--warmup", default=20, show_default=True, help="Untimed calls before timing.")
@click.option("--iters", default=200, show_default=True, help="Timed calls per batch size.")
@click.option("--threads", default=1, show_default=True, help="Intra-op threads given to each runtime.")
@click.option("--tolerance", multiple=True, help="TARGET:VARIANT=VALUE max-abs drift allowed (repeatable; '*' wildcards).")
@click.option("--config", type=click.Path(path_type=Path), help="matrix.toml with a [tolerance] table of the same keys.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds a cell may take before it is killed and FAILs.")
@click.option("--out", type=click.Path(path_type=Path), help="Report folder (default reports/<model name>).")
@click.option("--host-label", default="", help="Name of this host in merged reports (default os-arch).")
@click.option("--memory-limit", default=None,
              help="Address space each worker (and the reference) may use, e.g. 4G; beyond it the cell FAILs "
                   "with 'out of memory'. Default: physical memory, at least 4G.")
@click.option("--resume", type=click.Path(path_type=Path),
              help="Report folder of a killed or interrupted run: keep its finished cells, run only the missing ones.")
@click.option("--require", default="", help="Comma-separated targets that must run (not only SKIP), else exit 1.")
@FAIL_ON_OPTION
@BASELINE_OPTION
@LATENCY_THRESHOLD_OPTION
@DRIFT_FACTOR_OPTION
def run(model, targets, precisions, obs, n_obs, seed, batch_sizes, warmup, iters, threads, tolerance, config, timeout, out,
        host_label, memory_limit, resume, require, fail_on, baseline, latency_threshold, drift_factor):
    """Run the matrix on MODEL and write the report."""
    thresholds = _thresholds(drift_factor, latency_threshold)
    target_names = _target_names(targets)
    required = _required(require, target_names)
    limit = options.memory_size(memory_limit) if memory_limit else options.default_memory_limit()
    settings = RunConfig(  # cheap option checks first, the model (slow to load) last
        targets=target_names,
        precisions=_precisions(precisions),
        out=_out_dir(out, resume, model),
        observations=obs,
        n_obs=options.at_least(n_obs, 1, "--n-obs"),
        seed=options.at_least(seed, 0, "--seed"),
        batch_sizes=_ints(batch_sizes, "--batch-sizes"),
        warmup=options.at_least(warmup, 0, "--warmup"),
        iters=options.at_least(iters, 1, "--iters"),
        threads=options.at_least(threads, 1, "--threads"),
        timeout_s=options.seconds(timeout, "--timeout"),
        tolerances=_tolerances(list(tolerance), config),
        host_label=host_label,
        memory_limit=limit,
        resume=resume is not None,
        model=model_loader.load(model),
    )
    model_loader.check_declared_sizes(settings.model, limit, 1 if obs else n_obs)
    options.writable_dir(settings.out)
    baseline_results = schema.load(merge_shard_path(baseline)) if baseline else None  # a bad baseline fails first
    with lock_out(settings.out):
        try:
            results = run_matrix(settings, console)
        except OSError as error:  # a full disk (or read-only cache) before any cell ran: cells handle their own
            raise InputError(f"cannot write {error.filename or settings.out}: {error.strerror or error}") from None
        _finish(results, settings.out, fail_on, baseline_results, thresholds, required)


def _out_dir(out: Path | None, resume: Path | None, model: Path) -> Path:
    """--resume DIR continues in DIR; --out, when also given, must name the same folder."""
    if resume is None:
        return out or Path("reports") / model.stem
    if out is not None and out.resolve() != resume.resolve():
        raise InputError(f"--resume {resume} and --out {out}: a resumed run writes to the folder it resumes")
    return resume


def _required(value: str, target_names: list[str]) -> list[str]:
    names = _target_names(value) if value else []
    missing = [name for name in names if name not in target_names]
    if missing:
        raise InputError(f"--require {missing[0]}: that target is not in --targets")
    return names


def _thresholds(drift_factor: float, latency_threshold: float) -> Thresholds:
    return Thresholds(options.non_negative(drift_factor, "--drift-factor"),
                      options.non_negative(latency_threshold, "--latency-threshold"))


@app.command()
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder of the merged report.")
@FAIL_ON_OPTION
@BASELINE_OPTION
@LATENCY_THRESHOLD_OPTION
@DRIFT_FACTOR_OPTION
def merge(shards, out, fail_on, baseline, latency_threshold, drift_factor):
    """Merge SHARDS (results.json files or report folders, one per host) into one report."""
    baseline_results = schema.load(merge_shard_path(baseline)) if baseline else None
    thresholds = _thresholds(drift_factor, latency_threshold)
    _finish(merge_shards(list(shards)), options.writable_dir(out), fail_on, baseline_results, thresholds)


@app.command()
@click.option("--baseline", type=click.Path(path_type=Path), required=True, help="Earlier results.json (or its folder).")
@click.option("--current", type=click.Path(path_type=Path), required=True, help="Newer results.json (or its folder).")
@LATENCY_THRESHOLD_OPTION
@DRIFT_FACTOR_OPTION
def compare(baseline, current, latency_threshold, drift_factor):
    """Regressions of CURRENT against BASELINE, per cell (exit 1 if any)."""
    before, after = schema.load(merge_shard_path(baseline)), schema.load(merge_shard_path(current))
    found = compare_results(before, after, _thresholds(drift_factor, latency_threshold))
    _print_regressions(found)
    if not found:
        console.print("[green]no regressions[/]")
    sys.exit(1 if found else 0)


def _finish(results, out: Path, fail_on: str, baseline, thresholds: Thresholds, required: list[str] = ()) -> None:
    """Compare with the baseline, write the report, print the tally and exit with the verdict."""
    if baseline is not None:
        results.regressions = compare_results(baseline, results, thresholds)
    try:
        index = write_all(results, out)
    except OSError as error:  # a full disk: the earlier report stays whole (files are replaced atomically)
        raise InputError(f"cannot write the report to {out}: {error.strerror or error}") from None
    counts = {v: sum(c.verdict == v for c in results.cells) for v in ("PASS", "WARN", "FAIL", "SKIP")}
    console.print(" ".join(f"{k} {n}" for k, n in counts.items()))
    _print_regressions(results.regressions)
    console.print(f"report: [bold]{index}[/]")
    if "interrupted_after_cells" in results.settings:
        sys.exit(143 if results.settings.get("interrupted_by") == "SIGTERM" else 130)
    threshold = {"fail": ("FAIL",), "warn": ("FAIL", "WARN"), "skip": ("FAIL", "SKIP"), "never": ()}[fail_on]
    failed = any(c.verdict in threshold for c in results.cells)
    not_run = [name for name in required if all(c.verdict == "SKIP" for c in results.cells if c.target == name)]
    for name in not_run:
        console.print(f"[red]required target {name} did not run[/] (every cell SKIPped)")
    sys.exit(1 if failed or results.regressions or not_run else 0)


def _print_regressions(found) -> None:
    for regression in found:
        console.print(f"[red]regression[/] {escape(str(regression))}", highlight=False)


@app.command("targets")
def list_targets() -> None:
    """Every known target, and whether it can run here (or what to do about it)."""
    table = Table("target", "runtime", "status", "what it is")
    for target in registry.REGISTRY.values():
        reason = target.unavailable_reason()
        version = _safe_version(target)
        table.add_row(target.name, version, "[green]available[/]" if not reason else f"[yellow]{reason}[/]", target.summary)
    _stdout().print(table)


def _stdout() -> Console:
    """Piped output (CI logs, grep) gets a wide fixed width instead of wrapping at 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def _safe_version(target) -> str:
    try:
        return target.runtime_version()
    except Exception:  # not installed: the status column says what to do
        return "-"


@app.command()
@click.argument("model", type=click.Path(path_type=Path))
def lint(model: Path) -> None:
    """The deployment-readiness lints alone (exit 1 if any is an error)."""
    results = lint_model(model_loader.load(model))
    colours = {"ok": "green", "warn": "yellow", "error": "red"}
    table = Table("level", "lint", "finding")
    for item in results:
        table.add_row(f"[{colours[item.level]}]{item.level}[/]", item.id, escape(item.message))
    _stdout().print(table)
    sys.exit(1 if any(item.level == "error" for item in results) else 0)


def main() -> None:
    """Console entry point: user errors are one line on stderr and exit code 2."""
    signal.signal(signal.SIGTERM, raise_terminated)  # like Ctrl-C: report what finished, leave nothing running
    try:
        code = app.main(standalone_mode=False, prog_name="policy-matrix")
    except (InputError, click.UsageError) as error:
        message = error.format_message() if isinstance(error, click.UsageError) else str(error)
        print(f"policy-matrix: error: {message}", file=sys.stderr)
        sys.exit(2)
    except (click.Abort, KeyboardInterrupt) as error:
        print("policy-matrix: interrupted", file=sys.stderr)
        terminated = isinstance(error, Terminated) or isinstance(error.__cause__ or error.__context__, Terminated)
        sys.exit(143 if terminated else 130)
    sys.exit(code or 0)
