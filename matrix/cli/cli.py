"""The `policy-matrix` command line.

Imports of the heavy parts (numpy, onnx, matplotlib, every target) happen
inside the commands that use them: `--version`, `--help` and shell completion stay
about as fast as Python itself.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import click

from .. import __version__, options, outdir
from . import cli_args as args
from . import HELP_OPTIONS, is_the_program
from . import config as run_config_file
from ..errors import InputError, Terminated, raise_terminated
from ..errors import console_text as escape
from ..frameworks.command import frameworks as frameworks_command


@click.group(context_settings={"help_option_names": list(HELP_OPTIONS)}, epilog=(
    "Environment: POLICY_MATRIX_CACHE sets where converted artifacts and converter environments are kept "
    "(default ~/.cache/policy-matrix, or $XDG_CACHE_HOME/policy-matrix)."))
@click.version_option(__version__, prog_name="policy-matrix")
@click.option("-q", "--quiet", "quiet", count=True, help="Only errors (no progress, no tally) and, on exit 1, the one line saying why.")
@click.option("-v", "--verbose", "verbose", count=True, help="More detail (each cell's reason; setup steps already done).")
def app(quiet: int, verbose: int) -> None:
    """Run one exported policy on every runtime it ships on: parity drift against a
    float64 reference, latency, operator placement and the RL action contract."""
    global console
    context = click.get_current_context()
    if context.invoked_subcommand == "run":
        _warm_fork_server()
    console = _LazyConsole(verbose - quiet)
    context.meta["verbosity"] = verbose - quiet


def _warm_fork_server() -> None:
    """A run's reference job and cell workers are forked from a server that imports numpy, onnx and onnxruntime
    (~1 s, matrix/run/forkserver.py): started before `run` parses its options and imports its own modules (by the
    entry point, matrix/cli/__init__.py, already: then this does nothing), the two overlap, and the reference job
    finds its modules loaded. A run refused as bad input takes it down with it."""
    from ..run import forkserver

    forkserver.CLIENT.warm()


def _stderr_console(verbosity: int = 0):
    if verbosity < 0:
        return QuietConsole()
    from rich.console import Console

    # A CI log is not a terminal: long lines stay whole there instead of wrapping at 80 columns.
    return Console(stderr=True, soft_wrap=not sys.stderr.isatty())


class QuietConsole:
    """-q's console: it prints nothing, so nothing is rendered and rich is never imported (~35 ms of a single check's
    runner). What -q still says (an error, why the exit code is 1) is printed to stderr directly, not through it."""

    quiet = True
    is_terminal = False

    def print(self, *objects, **options) -> None:
        pass

    def status(self, *objects, **options):
        return contextlib.nullcontext()


class _LazyConsole:
    """The stderr console, made on first use: importing rich (~30 ms) costs start-up time that `--version` need not
    pay, and that a run pays while its reference job runs (matrix.run.orchestrate imports it then), not on the way
    to asking for it (under -q, never: QuietConsole). Stands for the console everywhere, rich's `with console:` (a
    live progress display) included."""

    def __init__(self, verbosity: int = 0):
        self._verbosity = verbosity
        self._console = None
        self.quiet = verbosity < 0  # known without making it

    def _made(self):
        if self._console is None:
            self._console = _stderr_console(self._verbosity)
        return self._console

    def __getattr__(self, name):
        return getattr(self._made(), name)

    def __enter__(self):
        return self._made().__enter__()

    def __exit__(self, *exception):
        return self._made().__exit__(*exception)


console = _LazyConsole()


def _verbosity() -> int:
    return click.get_current_context().meta.get("verbosity", 0)


def _use_user_browser(context: click.Context, parameter: click.Parameter, value: str | None) -> None:
    """--browser-endpoint / --browser-path reach the browser targets (and their cell workers) through the environment."""
    if not value:
        return
    from targets import chromium  # only when asked: keeps the CLI's start-up free of the browser code

    if parameter.name == "browser_endpoint":
        try:
            chromium.user_browser_version(value)
        except ValueError as error:
            raise click.BadParameter(str(error), param=parameter) from None
        except OSError as error:
            raise click.BadParameter(f"no DevTools endpoint answers at {value} ({error})", param=parameter) from None
        os.environ[chromium.BROWSER_ENDPOINT_ENV] = value
    else:
        if not os.access(value, os.X_OK):
            raise click.BadParameter(f"{value} is not an executable file", param=parameter)
        os.environ[chromium.BROWSER_PATH_ENV] = value


BROWSER_ENDPOINT_OPTION = click.option(
    "--browser-endpoint", envvar="POLICY_MATRIX_BROWSER_ENDPOINT", expose_value=False, callback=_use_user_browser,
    help="Run the ort-web-* targets in a Chrome you started on this machine (e.g. with a real GPU), over DevTools: "
         "ws://127.0.0.1:PORT/devtools/browser/… or http://127.0.0.1:PORT (start Chrome with --remote-debugging-port=PORT).")
BROWSER_PATH_OPTION = click.option(
    "--browser-path", envvar="POLICY_MATRIX_BROWSER_PATH", expose_value=False, callback=_use_user_browser,
    help="Chrome / Chromium executable the ort-web-* targets launch instead of the one found by setup.")


@app.command(epilog="Every option can also be set in matrix.toml (or [tool.policy-matrix] in pyproject.toml) "
                     "under its own name, e.g. iters = 100, targets = [\"ort-*\"]; the command line wins.")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--config", type=click.Path(path_type=Path), is_eager=True, expose_value=False,
              callback=run_config_file.load_into,
              help="Settings file (default ./matrix.toml, else [tool.policy-matrix] in ./pyproject.toml).")
@args.SELECTION
@args.OBSERVATIONS
@args.TIMING
@args.JUDGING
@args.LIMITS
@args.OUTPUT
@args.BEHAVIOUR
@args.ASSIST
@args.CANDIDATES
@args.SOURCE
@args.DECISION
@click.option("--json", "as_json", is_flag=True,
              help="Also print the verdict counts and the per-target decision (the ship table) as JSON on stdout.")
@args.ENDING
@BROWSER_ENDPOINT_OPTION
@BROWSER_PATH_OPTION
def run(model: Path, as_json: bool, **values) -> None:
    """Run the matrix on MODEL and write the report."""
    from ..run.orchestrate import lock_out
    from ..run.orchestrate import run as run_matrix

    ending = args.ENDING.parse(values)
    config = args.run_config(model, values)
    baseline = _baseline(ending)  # a bad one fails first, before --out is made
    outdir.claim(config.out, "--resume" if config.resume else "--out")
    with lock_out(config.out):
        try:
            results = run_matrix(config, console)
        except OSError as error:  # a full disk (or read-only cache) before any cell ran: cells handle their own
            raise InputError(f"cannot write {error.filename or config.out}: {error.strerror or error}") from None
        results.run_options["decision"] = config.decision.record()
        results.decision = config.decision.decide(results)
        results.required_not_run = [name for name in config.required
                                     if all(c.verdict == "SKIP" for c in results.cells if c.target == name)]
        _finish(results, config.out, ending, baseline, as_json, own_run=True)


def _baseline(ending: dict):
    """--baseline's results (a results.json or its folder), or None; merge's modules only when one is given. With
    --baseline-mismatch note, one that cannot be read (a truncated download, another schema version) is the words
    why: the run goes on, and its report says why nothing was compared."""
    if ending["baseline"] is None:
        return None
    from .. import results as schema
    from ..decide.merge import shard_path as merge_shard_path

    try:
        return schema.load(merge_shard_path(ending["baseline"]))
    except InputError as unreadable:
        if ending["baseline_mismatch"] != "note":
            raise
        return str(unreadable)


@app.command()
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=args.REPORT_FOLDER, required=True, help="Folder of the merged report.")
@args.ENDING
def merge(shards, out, **values):
    """Merge SHARDS (results.json files or report folders, one per host) into one report."""
    from ..decide.decide import Request
    from ..decide.merge import merge as merge_shards
    from ..run.orchestrate import lock_out

    ending = args.ENDING.parse(values)
    baseline = _baseline(ending)
    merged = merge_shards(list(shards), ending["allow_different_inputs"], out)
    merged.decision = Request.recorded(merged.run_options).decide(merged)  # the first shard's budgets, over every host's cells
    with lock_out(outdir.claim(out)):  # never replace the report of a run still writing there
        _finish(merged, out, ending, baseline)


@app.command()
@click.option("--baseline", type=click.Path(path_type=Path), required=True, help="Earlier results.json (or its folder).")
@click.option("--current", type=click.Path(path_type=Path), required=True, help="Newer results.json (or its folder).")
@args.LATENCY_THRESHOLD_OPTION
@args.DRIFT_FACTOR_OPTION
@click.option("--json", "as_json", is_flag=True,
              help="Print the regressions as a JSON list on stdout; what was not compared is still said on stderr.")
@args.ALLOW_DIFFERENT_INPUTS_OPTION
def compare(baseline, current, latency_threshold, drift_factor, as_json, allow_different_inputs):
    """Regressions of CURRENT against BASELINE, per cell (exit 1 if any)."""
    from .. import results as schema
    from ..decide.compare import compare as compare_results
    from ..decide.compare import coverage
    from ..decide.merge import shard_path as merge_shard_path

    before, after = schema.load(merge_shard_path(baseline)), schema.load(merge_shard_path(current))
    found = compare_results(before, after, args.thresholds(drift_factor, latency_threshold), allow_different_inputs)
    if as_json:  # stdout stays the list; a script reading only it would take what was not compared for compared
        _print_json([regression.model_dump(mode="json") for regression in found])
        _print_coverage(coverage(before, after))
    else:
        _print_regressions(found)
        _print_coverage(coverage(before, after))
        if not found:
            console.print("[green]no regressions[/]")
    sys.exit(1 if found else 0)


def _finish(results, out: Path, ending: dict, baseline, as_json: bool = False, own_run: bool = False) -> None:
    """Compare with the baseline, write the report, print the tally and exit with the verdict (130/143 when
    this run itself was interrupted; an interrupted shard in a merge is shown in the report, not the exit code;
    a `--require`d target that did not run, of this run or of a merged shard, exits 1)."""
    from .. import results as schema
    from ..decide.decide import summary_lines
    from ..report.report import write_all

    if baseline is not None:
        _compare_with_baseline(results, out, baseline, ending)
    try:
        index = write_all(results, out)
    except OSError as error:  # a full disk: the earlier report stays whole (files are replaced atomically)
        raise InputError(f"cannot write the report to {out}: {error.strerror or error}") from None
    counts = {v: sum(c.verdict == v for c in results.cells) for v in schema.VERDICTS}
    if _verbosity() > 0:
        for cell in results.cells:
            console.print(escape(f"{cell.verdict:4} {cell.configuration.label}: {'; '.join(cell.reasons)}"), highlight=False)
    console.print(" ".join(f"{k} {n}" for k, n in counts.items()))
    for line in summary_lines(results):
        console.print(escape(line), highlight=False)
    _print_regressions(results.regressions)
    if results.baseline is not None:
        _print_coverage(results.baseline)
    console.print(f"report: [bold]{escape(str(index))}[/]")
    if as_json:
        _print_json({"report": str(index), "counts": counts, "observations": results.model.get("observation_source"),
                     "required_not_run": results.required_not_run,
                     "decision": [decision.model_dump(mode="json") for decision in results.decision],
                     "regressions": [regression.model_dump(mode="json") for regression in results.regressions],
                     "baseline": results.baseline.model_dump(mode="json") if results.baseline else None})
    if own_run and results.interrupted is not None:
        sys.exit(143 if results.interrupted.signal == "SIGTERM" else 130)
    fail_on = ending["fail_on"]
    threshold = {"fail": ("FAIL",), "warn": ("FAIL", "WARN"), "skip": ("FAIL", "SKIP"), "never": ()}[fail_on]
    failed = [c.verdict for c in results.cells if c.verdict in threshold]
    for name in results.required_not_run:  # an error: said even under -q, which silences the console
        print(f"policy-matrix: required target {name} did not run (every cell SKIPped)", file=sys.stderr)
    if failed or results.regressions:  # why the exit code is 1, said even under -q
        print(f"policy-matrix: exit 1: {_exit_reason(failed, len(results.regressions), fail_on)}", file=sys.stderr)
    sys.exit(1 if failed or results.regressions or results.required_not_run else 0)


def _exit_reason(failed: list[str], regressions: int, fail_on: str) -> str:
    """e.g. "3 cells: 2 FAIL, 1 WARN (--fail-on warn); 1 regression against the baseline"."""
    verdicts = ", ".join(f"{failed.count(v)} {v}" for v in dict.fromkeys(failed))
    parts = [f"{len(failed)} cell{'s' if len(failed) != 1 else ''}: {verdicts} (--fail-on {fail_on})"] if failed else []
    if regressions:
        parts.append(f"{regressions} regression{'s' if regressions != 1 else ''} against the baseline")
    return "; ".join(parts)


def _print_regressions(found) -> None:
    for regression in found:
        console.print(f"[red]regression[/] {escape(str(regression))}", highlight=False)


def _compare_with_baseline(results, out: Path, baseline, ending: dict) -> None:
    """Regressions against the baseline and what was compared (results.baseline). A baseline that cannot be compared
    is refused (exit 2; the run's own report is still written), or with --baseline-mismatch note said in the report."""
    from ..decide.compare import compare as compare_results
    from ..decide.compare import coverage
    from ..report.report import write_all
    from ..results import BaselineCoverage

    if isinstance(baseline, str):  # unreadable, noted (_baseline)
        results.baseline = BaselineCoverage(compared=0, refused=baseline)
        return
    try:
        results.regressions = compare_results(baseline, results, ending["thresholds"], ending["allow_different_inputs"])
    except InputError as refused:
        if ending["baseline_mismatch"] != "note":
            write_all(results, out)
            raise
        results.baseline = BaselineCoverage(compared=0, refused=str(refused))
        return
    results.baseline = coverage(baseline, results)


def _print_coverage(covered) -> None:
    for line in covered.lines():
        console.print(f"[yellow]{escape(line)}[/]", highlight=False)


@app.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list on stdout (name, runtime, available, reason, summary).")
@click.option("--versions", "versions_of", metavar="TARGET",
              help="List the releases of TARGET's runtime the registry offers (PyPI or npm) that the harness supports, "
                   "marking the default and those already installed: run one with --targets TARGET@VERSION. "
                   "With --json: a list of {release, default, installed}.")
def list_targets(as_json: bool, versions_of: str | None) -> None:
    """Every known target, and whether it can run here (or what to do about it)."""
    import targets as registry

    if versions_of:
        _list_versions(versions_of, as_json)
        return
    rows = [{"name": target.name, "runtime": _safe_version(target), "available": reason is None, "reason": reason,
             "summary": target.summary}
            for target in registry.REGISTRY.values() for reason in [target.unavailable_reason()]]
    if as_json:
        _print_json(rows)
        return
    from rich.table import Table

    table = Table("target", "runtime", "status", "what it is")
    for row in rows:  # hints hold brackets ('policy-matrix[tract]') that rich would read as markup
        status = "[green]available[/]" if row["available"] else f"[yellow]{escape(row['reason'])}[/]"
        table.add_row(escape(row["name"]), escape(row["runtime"]), status, escape(row["summary"]))
    _stdout().print(table)


def _list_versions(name: str, as_json: bool) -> None:
    import subprocess

    import targets as registry
    from targets import versions

    from ..runtime_versions import release_number

    if name not in registry.REGISTRY:
        raise InputError(f"--versions: unknown target {name!r}; known: {', '.join(registry.REGISTRY)}")
    target = registry.get(name)
    try:
        offered = versions.supported_versions(target)
    except versions.BadRelease as error:
        raise InputError(str(error)) from None
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:  # the registry is out of reach
        raise InputError(f"--versions {name}: cannot list releases: {error}") from None
    release = versions.release_of(target)
    default = release_number(_safe_version(target))  # what the unsuffixed target runs ('-' when not installed)
    rows = [{"release": v, "default": v == default, "installed": v == default or release.installed(v)} for v in offered]
    if as_json:
        _print_json(rows)
        return
    click.echo(f"{name} runs {release.package}; releases from {release.floor} on ({release.why_floor}); "
               f"default: the one {name} runs without @RELEASE, installed: ready in the cache, no download:")
    click.echo(" ".join(row["release"] + _marks(row) for row in rows))


def _marks(row: dict) -> str:
    marks = [mark for mark in ("default", "installed") if row[mark] and not (mark == "installed" and row["default"])]
    return f" ({', '.join(marks)})" if marks else ""


def _print_json(data) -> None:
    click.echo(json.dumps(data, indent=2))


def _stdout():
    """Piped output (CI logs, grep) gets a wide fixed width instead of wrapping at 80 columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def _safe_version(target) -> str:
    try:
        return target.runtime_version()
    except Exception:  # not installed: the status column says what to do
        return "-"


@app.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the lints as a JSON list on stdout (id, level, message).")
@args.BATCH_AXIS_OPTION
def lint(model: Path, as_json: bool, batch_axis: tuple[str, ...]) -> None:
    """The deployment-readiness lints alone (exit 1 if any is an error)."""
    from dataclasses import asdict

    from ..inputs import model as model_loader
    from ..inputs.batch_axes import parse_given
    from ..inputs.lint import lint as lint_model

    results = lint_model(model_loader.load(model, parse_given(batch_axis)))
    failed = any(item.level == "error" for item in results)
    if as_json:
        _print_json([asdict(item) for item in results])
        sys.exit(1 if failed else 0)
    from rich.table import Table

    colours = {"ok": "green", "warn": "yellow", "error": "red"}
    table = Table("level", "lint", "finding")
    for item in results:
        table.add_row(f"[{colours[item.level]}]{item.level}[/]", item.id, escape(item.message))
    _stdout().print(table)
    sys.exit(1 if failed else 0)


@app.command()
@click.argument("groups", nargs=-1, type=click.Choice(["core", "web", "tflite", "coreml", "all", "frameworks"]))
def setup(groups: tuple[str, ...]) -> None:
    """Install what the targets of GROUPS need (default: all): core (tract), web (npm packages,
    Playwright, Chromium), tflite (LiteRT, the onnx2tf environment), coreml (its environment).
    frameworks (opt-in, never part of all): each RL framework's environment for `policy-matrix frameworks`.
    Only what is missing is installed: a second run does nothing (exit 1 if a step failed)."""
    from .installer import setup as run_setup

    sys.exit(0 if run_setup(list(groups) or ["all"], console, _verbosity()) else 1)


@app.command(epilog="Exit 0: a change was found; 1: no change between OLD and NEW; 2: bad input. Each visited release's "
                     "own run is kept under OUT/releases/RELEASE; OUT/bisect.md lists them and OUT/index.html shows the "
                     "two neighbours side by side (with no change found: the oldest release and the newest that ran here).")
@click.argument("target")
@click.argument("release_range", metavar="OLD..NEW")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--measure", type=click.Choice(["verdict", "drift", "agreement", "return", "p50", "placement"]),
              default="verdict", show_default=True,
              help="What must change: the cell's verdict, max-abs drift from the reference, agreement of discrete actions, "
                   "mean return (needs --env), p50 at the smallest batch (beyond its noise band) or the nodes that fall back.")
@click.option("--threshold", type=float, default=None,
              help="How much is a change: drift: growth factor (default 10); agreement: share (0.01); return: return "
                   "units (5% of the old release's reference return); p50: fraction beyond the noise band (0.25).")
@click.option("--variant", default="fp32", show_default=True, help="The precision whose cell is compared.")
@click.option("--out", type=click.Path(path_type=Path), help="Bisect folder (default reports/bisect-<model name>).")
@click.option("--obs", type=click.Path(path_type=Path), help="Recorded observations (.npy for one input, .npz keyed by input name).")
@click.option("--n-obs", default=options.DEFAULT_N_OBS, show_default=True, help="Size of the seeded observation set when --obs is not given.")
@click.option("--seed", default=options.DEFAULT_SEED, show_default=True, help="Seed of the observation set and of the first episode.")
@click.option("--batch-sizes", default=",".join(map(str, options.DEFAULT_BATCH_SIZES)), show_default=True, help="Batch sizes to time.")
@click.option("--warmup", default=options.DEFAULT_WARMUP, show_default=True, help="Untimed calls before timing.")
@click.option("--iters", default=options.DEFAULT_ITERS, show_default=True, help="Timed calls per batch size.")
@click.option("--threads", default=options.DEFAULT_THREADS, show_default=True, help="Intra-op threads given to the runtime.")
@click.option("--tolerance", multiple=True, help="TARGET:VARIANT=VALUE max-abs drift allowed (as in `run`).")
@click.option("--timeout", default=options.DEFAULT_TIMEOUT_S, show_default=True, help="Seconds a cell may take.")
@click.option("--memory-limit", default=None, help="Memory each worker may allocate, e.g. 4G.")
@click.option("--env", default=None, help="Gymnasium id or module:Class: each release drives episodes (the return measure).")
@click.option("--episodes", default=None, type=int, help="Episodes per release with --env.  [default: 10]")
@click.option("--env-kwargs", default=None, help="JSON object of keyword arguments for the environment.")
@args.SIDE_INPUT_OPTION
@BROWSER_ENDPOINT_OPTION
@BROWSER_PATH_OPTION
def bisect(target, release_range, model, measure, threshold, variant, out, obs, n_obs, seed, batch_sizes, warmup, iters,
           threads, tolerance, timeout, memory_limit, env, episodes, env_kwargs, side_input):
    """The first release of TARGET's runtime between OLD and NEW where MODEL's MEASURE changed, in log2 steps."""
    from . import release_bisect as releases
    from ..run.orchestrate import RunConfig, lock_out

    old, new = releases.parse_range(release_range)
    chosen = releases.MEASURES[measure]
    releases.check_threshold(chosen, threshold)
    if measure == "return" and not env:
        raise InputError("--measure return needs --env (an environment whose episodes give a return)")
    names = args.target_names(target)
    if len(names) != 1 or "@" in names[0]:
        raise InputError(f"bisect: {target!r}: name one target, without @RELEASE (the range gives the releases)")
    offered, floor = releases.offered(names[0])
    limit = options.memory_size(memory_limit) if memory_limit else options.default_memory_limit()
    given_side_inputs = args.side_inputs_given(side_input)
    config = RunConfig(
        targets=names, variants=_one_variant(variant), out=out or Path("reports") / f"bisect-{model.stem}", observations=obs,
        n_obs=options.at_least(n_obs, 1, "--n-obs"), seed=options.at_least(seed, 0, "--seed"),
        batch_sizes=args.ints(batch_sizes, "--batch-sizes"), warmup=options.at_least(warmup, 0, "--warmup"),
        iters=options.at_least(iters, 1, "--iters"), threads=options.at_least(threads, 1, "--threads"),
        timeout_s=options.seconds(timeout, "--timeout"), tolerances=args.tolerances(list(tolerance)), memory_limit=limit,
        model=args.load_model(model, limit, {}),
    )
    config.side_inputs = args.side_input_values(given_side_inputs, config.model)
    config.rollout, config.return_tolerance = args.rollout_options(
        config.model, seed, {"env": env, "episodes": episodes, "env_kwargs": env_kwargs}, config.limits, config.side_inputs)
    span = releases.releases_between(offered, old, new, floor)
    outdir.claim(config.out)
    with lock_out(config.out):
        found = releases.bisect(config, names[0], span, chosen, threshold, console)
    sys.exit(0 if found else 1)


app.add_command(frameworks_command)


def _one_variant(value: str) -> list[str]:
    chosen = args.variants(value)
    if len(chosen) != 1:
        raise InputError(f"--variant {value!r}: a bisect compares one variant's cell, e.g. --variant fp32")
    return chosen


def main() -> None:
    """Console entry point: user errors are one line on stderr and exit code 2."""
    global _exit_status
    signal.signal(signal.SIGTERM, raise_terminated)  # like Ctrl-C: report what finished, leave nothing running
    # Python installs its Ctrl-C handler only when SIGINT was not ignored at start; a background job of a
    # non-interactive shell inherits it ignored, and an interrupt would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if is_the_program():
        sys.stdout, sys.stderr = ReaderMayLeave(sys.stdout), ReaderMayLeave(sys.stderr)
        # What a command imported (numpy, onnx, pydantic's schemas, ...) lives until the process ends; the
        # interpreter's teardown would then free it module by module, object by object (~0.1 s at the end of a run,
        # bench/matrix_wall.py "exit"). Registered first, this handler runs last: other threads have been joined
        # and every other atexit handler has run. Not inside another program (the tests call main() in process).
        atexit.register(_end_without_teardown)
    try:
        _run_app()
    except SystemExit as stop:
        _exit_status = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
        raise


class ReaderMayLeave:
    """A standard stream whose reader may go away (`policy-matrix run … 2>&1 | head -1`): from the first write it
    refuses, what the process writes there goes to /dev/null (Python's documented BrokenPipeError recipe), and the
    command goes on. A run's product is its results and report, and its exit status says what its cells did (CI
    reads 1 as a FAILed cell): a closed pipe is neither, so the run writes everything and exits with its own status,
    never with BrokenPipeError's 1 halfway through, nor with a killed process's 141."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """The stream's descriptor now writes to /dev/null: what it still buffers goes there on its next flush."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):  # everything else (isatty, fileno, encoding) is the stream's own
        return getattr(self._stream, name)


_exit_status: int | None = None  # what main() exits with (None: it raised something else), for _end_without_teardown


def _end_without_teardown() -> None:
    """The process ends with main()'s status once the standard streams are flushed, as the interpreter would
    end it, but without freeing what is loaded first. Files the commands write are closed by then (written
    whole, then swapped in); an exception main() did not turn into a status ends the usual way."""
    if _exit_status is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away, a closed stream
            stream.flush()
    os._exit(_exit_status)


def _run_app() -> None:
    try:
        code = app.main(standalone_mode=False, prog_name="policy-matrix")
    except (InputError, click.UsageError) as error:
        message = error.format_message() if isinstance(error, click.UsageError) else str(error)
        # one line whatever a name in it holds: a --host-label, a model name or an option read from a results file
        print(f"policy-matrix: error: {' '.join(message.splitlines())}", file=sys.stderr)
        sys.exit(2)
    except (click.Abort, KeyboardInterrupt) as error:
        print("policy-matrix: interrupted", file=sys.stderr)
        terminated = isinstance(error, Terminated) or isinstance(error.__cause__ or error.__context__, Terminated)
        sys.exit(143 if terminated else 130)
    sys.exit(code or 0)
