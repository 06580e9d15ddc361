"""The `policy-matrix` command line."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import targets as registry
from targets.base import VARIANTS

from . import model as model_loader
from .errors import InputError
from .lint import lint as lint_model
from .orchestrate import RunConfig, run as run_matrix
from .report import write_all
from .verdict import Tolerances

app = typer.Typer(
    help="Run one exported policy on every runtime it ships on; report drift, latency, placement and the RL contract.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
console = Console(stderr=True)
FAIL_ON = ("fail", "warn", "never")


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
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise InputError(f"{path}: cannot read the config ({error})") from None
    try:
        return {key: float(value) for key, value in data.get("tolerance", {}).items()}
    except (TypeError, ValueError):
        raise InputError(f"{path}: [tolerance] values must be numbers") from None


@app.command()
def run(
    model: Annotated[Path, typer.Argument(help="The policy, an .onnx file.")],
    targets: Annotated[str, typer.Option(help="Comma-separated target names, or 'all'.")] = "all",
    precisions: Annotated[str, typer.Option(help="Comma-separated variants: fp32, fp16, int8.")] = "fp32,fp16,int8",
    obs: Annotated[Path | None, typer.Option(help="Recorded observations (.npy for one input, .npz keyed by input name).")] = None,
    n_obs: Annotated[int, typer.Option(help="Size of the seeded observation set when --obs is not given.")] = 128,
    seed: Annotated[int, typer.Option(help="Seed of the generated observation set.")] = 0,
    batch_sizes: Annotated[str, typer.Option(help="Batch sizes to time.")] = "1,64",
    warmup: Annotated[int, typer.Option(help="Untimed calls before timing.")] = 20,
    iters: Annotated[int, typer.Option(help="Timed calls per batch size.")] = 200,
    threads: Annotated[int, typer.Option(help="Intra-op threads given to each runtime.")] = 1,
    tolerance: Annotated[list[str], typer.Option(help="TARGET:VARIANT=VALUE max-abs drift allowed (repeatable; '*' wildcards).")] = [],
    config: Annotated[Path | None, typer.Option(help="matrix.toml with a [tolerance] table of the same keys.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds a cell may take before it is killed and FAILs.")] = 600.0,
    out: Annotated[Path | None, typer.Option(help="Report folder (default reports/<model name>).")] = None,
    host_label: Annotated[str, typer.Option(help="Name of this host in merged reports (default os-arch).")] = "",
    fail_on: Annotated[str, typer.Option(help="Exit 1 when a cell is at least this bad: fail, warn or never.")] = "fail",
) -> None:
    """Run the matrix on MODEL and write the report."""
    if fail_on not in FAIL_ON:
        raise InputError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    info = model_loader.load(model)
    settings = RunConfig(
        model=info,
        targets=_target_names(targets),
        precisions=_precisions(precisions),
        out=out or Path("reports") / model.stem,
        observations=obs,
        n_obs=n_obs,
        seed=seed,
        batch_sizes=_ints(batch_sizes, "--batch-sizes"),
        warmup=warmup,
        iters=max(1, iters),
        threads=threads,
        timeout_s=timeout,
        tolerances=Tolerances.parse(tolerance, _config_tolerances(config)),
        host_label=host_label,
    )
    results = run_matrix(settings, console)
    index = write_all(results, settings.out)
    counts = {v: sum(c.verdict == v for c in results.cells) for v in ("PASS", "WARN", "FAIL", "SKIP")}
    console.print(" ".join(f"{k} {n}" for k, n in counts.items()))
    console.print(f"report: [bold]{index}[/]")
    threshold = {"fail": ("FAIL",), "warn": ("FAIL", "WARN"), "never": ()}[fail_on]
    raise typer.Exit(1 if any(c.verdict in threshold for c in results.cells) else 0)


@app.command("targets")
def list_targets() -> None:
    """Every known target, and whether it can run here (or what to do about it)."""
    table = Table("target", "runtime", "status", "what it is")
    for target in registry.REGISTRY.values():
        reason = target.unavailable_reason()
        version = _safe_version(target)
        table.add_row(target.name, version, "[green]available[/]" if not reason else f"[yellow]{reason}[/]", target.summary)
    Console().print(table)


def _safe_version(target) -> str:
    try:
        return target.runtime_version()
    except Exception:  # not installed: the status column says what to do
        return "-"


@app.command()
def lint(model: Annotated[Path, typer.Argument(help="The policy, an .onnx file.")]) -> None:
    """The deployment-readiness lints alone (exit 1 if any is an error)."""
    results = lint_model(model_loader.load(model))
    marks = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "error": "[red]error[/]"}
    out = Console()
    for item in results:
        out.print(f"{marks[item.level]:>20} {item.id:<20} {escape(item.message)}", highlight=False)
    raise typer.Exit(1 if any(item.level == "error" for item in results) else 0)


def main() -> None:
    try:
        app(standalone_mode=True)
    except InputError as error:
        print(f"policy-matrix: error: {error}", file=sys.stderr)
        sys.exit(2)
