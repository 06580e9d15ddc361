"""The `policy-matrix` command line.

Imports of the heavy parts (numpy, onnx, pandas, matplotlib, every target) happen
inside the commands that use them: `--version`, `--help` and shell completion stay
about as fast as Python itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from . import __version__, options
from . import config as run_config_file
from .errors import InputError, Terminated, raise_terminated
from .frameworks.command import frameworks as frameworks_command
from .rules import DEFAULT_MIN_AGREEMENT, DEFAULT_TIE_MARGIN


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=(
    "Environment: POLICY_MATRIX_CACHE sets where converted artifacts and converter environments are kept "
    "(default ~/.cache/policy-matrix, or $XDG_CACHE_HOME/policy-matrix)."))
@click.version_option(__version__, prog_name="policy-matrix")
@click.option("-q", "--quiet", "quiet", count=True, help="Only errors (no progress, no tally).")
@click.option("-v", "--verbose", "verbose", count=True, help="More detail (each cell's reason; setup steps already done).")
def app(quiet: int, verbose: int) -> None:
    """Run one exported policy on every runtime it ships on: parity drift against a
    float64 reference, latency, operator placement and the RL action contract."""
    global console
    console = _stderr_console(verbose - quiet)
    click.get_current_context().meta["verbosity"] = verbose - quiet


def _stderr_console(verbosity: int = 0):
    from rich.console import Console

    # A CI log is not a terminal: long lines stay whole there instead of wrapping at 80 columns.
    return Console(stderr=True, quiet=verbosity < 0, soft_wrap=not sys.stderr.isatty())


class _LazyConsole:
    """The stderr console, made on first use: importing rich costs start-up time `--version` need not pay."""

    def __getattr__(self, name):
        global console
        console = _stderr_console()
        return getattr(console, name)


console = _LazyConsole()


def _verbosity() -> int:
    return click.get_current_context().meta.get("verbosity", 0)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class _ReportFolder(click.Path):
    """A folder the tool writes: an empty name would silently mean the current folder."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: name a report folder", param, ctx)
        return super().convert(value, param, ctx)


REPORT_FOLDER = _ReportFolder(path_type=Path)

FAIL_ON = ("fail", "warn", "skip", "never")
FAIL_ON_OPTION = click.option(
    "--fail-on", type=click.Choice(FAIL_ON), default="fail", show_default=True,
    help="Exit 1 when a cell is at least this bad (skip: a FAILed or SKIPped cell)."
)
BASELINE_OPTION = click.option(
    "--baseline", type=click.Path(path_type=Path), help="Earlier results.json to flag regressions against (exit 1 if any)."
)
BATCH_AXIS_OPTION = click.option(
    "--batch-axis", "batch_axis", multiple=True,
    help="NAME=AXIS: the batch axis of an input where inference gets it wrong (repeatable; -1: no batch, fed whole). "
         "Inferred otherwise: axis 0 of the first input, a recurrent pair's axis (an LSTM state [layers, batch, hidden]: 1), "
         "the observation's batch symbol."
)
LATENCY_THRESHOLD_OPTION = click.option(
    "--latency-threshold", default=0.25, show_default=True, help="p50 slowdown (fraction) that counts as a regression."
)
DRIFT_FACTOR_OPTION = click.option(
    "--drift-factor", default=10.0, show_default=True, help="Drift growth factor that counts as a regression."
)
ALLOW_DIFFERENT_INPUTS_OPTION = click.option(
    "--allow-different-inputs", is_flag=True,
    help="Compare or merge results measured on different observations, episodes or judging settings (refused by "
         "default); the difference is printed in every regression line."
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


def _target_names(value: str, skip: str = "", option: str = "--targets") -> list[str]:
    import targets as registry

    from .selection import select_targets

    chosen = select_targets(value, skip, list(registry.REGISTRY), option)
    for label in chosen:  # a malformed @release, or one on a target that has none, is bad input
        registry.get(label)
    return chosen


def _variants(value: str) -> list[str]:
    from targets.base import VARIANTS

    names = _csv(value)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise InputError(f"unknown variant {(unknown or [value])[0]!r}; known: {', '.join(VARIANTS)}")
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise InputError(f"--variants {value}: {twice} is given twice (each variant is one cell per target)")
    return names


# Where a value came from, strongest first: --precisions (the old name) loses to --variants given the same way.
_SOURCE_RANK = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.DEFAULT_MAP, ParameterSource.DEFAULT)


def _variants_option(variants: str, precisions: str | None) -> str:
    """--variants, or the hidden --precisions it replaced (scripts and matrix.toml files still use it),
    whichever was given more directly; both on the command line must agree."""
    if precisions is None:
        return variants
    ctx = click.get_current_context()
    new, old = ctx.get_parameter_source("variants"), ctx.get_parameter_source("precisions")
    if new == old == ParameterSource.COMMANDLINE and _csv(variants) != _csv(precisions):
        raise InputError(f"--variants {variants} and --precisions {precisions}: give one (--precisions is its old name)")
    return precisions if _SOURCE_RANK.index(old) < _SOURCE_RANK.index(new) else variants


def _tie_margin(value: float) -> float:
    if not value >= 0 or value == float("inf"):
        raise InputError(f"--tie-margin {value}: expected a finite number >= 0, e.g. 1e-3")
    return value


def _min_agreement(value: float) -> float:
    if not 0 <= value <= 1:
        raise InputError(f"--min-agreement {value}: expected a share between 0 and 1, e.g. 0.99")
    return value


def _tolerances(specs: list[str]):
    """Every override (command line or the config's [tolerance] table) is a number >= 0 whose key matches some
    target or variant."""
    import targets as registry
    from targets.base import VARIANTS

    from .rules import Tolerances
    from .runtime_versions import release_key
    from .source import TARGET as SOURCE_TARGET

    tolerances = Tolerances.parse(specs, click.get_current_context().meta.get("config_tolerances", {}))
    for key, value in [*tolerances.overrides.items(), *tolerances.rtol_overrides.items()]:
        where = f"tolerance {key!r}"
        options.tolerance_value(value, where)
        options.tolerance_key(release_key(key, where), [*registry.REGISTRY, SOURCE_TARGET], VARIANTS, where)
    return tolerances


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
@click.option("--targets", default="all", show_default=True,
              help="Comma-separated target names or globs (ort-web-*), or 'all'. NAME@VERSION runs that release of the "
                   "runtime beside the default (ort-cpu@1.20.1,ort-cpu); `policy-matrix targets --versions NAME` lists them.")
@click.option("--skip", default="", help="Comma-separated target names or globs to leave out.")
@click.option("--variants", default=",".join(options.DEFAULT_VARIANTS), show_default=True,
              help="Comma-separated variants (the artifact's precision): fp32, fp16, int8.")
@click.option("--precisions", default=None, hidden=True, help="Old name of --variants, still accepted.")
@click.option("--obs", type=click.Path(path_type=Path), help="Recorded observations (.npy for one input, .npz keyed by input name).")
@click.option("--n-obs", default=options.DEFAULT_N_OBS, show_default=True, help="Size of the seeded observation set when --obs is not given.")
@click.option("--seed", default=options.DEFAULT_SEED, show_default=True,
              help="Seed of the generated observation set, and of the first episode (episode i resets with seed+i).")
@click.option("--batch-sizes", default=",".join(map(str, options.DEFAULT_BATCH_SIZES)), show_default=True, help="Batch sizes to time.")
@click.option("--warmup", default=options.DEFAULT_WARMUP, show_default=True, help="Untimed calls before timing.")
@click.option("--iters", default=options.DEFAULT_ITERS, show_default=True, help="Timed calls per batch size.")
@click.option("--threads", default=options.DEFAULT_THREADS, show_default=True, help="Intra-op threads given to each runtime.")
@click.option("--tolerance", multiple=True,
              help="TARGET:VARIANT=ATOL[,rtol=RTOL]: |y - y_ref| <= ATOL + RTOL*|y_ref| per element (repeatable; '*' "
                   "wildcards; atol also from a [tolerance] table). Defaults: fp32 1e-4/1e-5, fp16 2e-2/1e-3, int8 0.25/1e-2.")
@click.option("--tie-margin", default=DEFAULT_TIE_MARGIN, show_default=True,
              help="Discrete actions: a flip counts only where the reference's top-1 minus top-2 logit is above this.")
@click.option("--min-agreement", default=DEFAULT_MIN_AGREEMENT, show_default=True,
              help="Discrete actions: flips that bring agreement with the reference below this share FAIL the cell (above it: WARN).")
@click.option("--timeout", default=options.DEFAULT_TIMEOUT_S, show_default=True, help="Seconds a cell may take before it is killed and FAILs (at most 10^6).")
@click.option("--out", type=REPORT_FOLDER, help="Report folder (default reports/<model name>).")
@click.option("--host-label", default="", help="Name of this host in merged reports (default os-arch).")
@click.option("--memory-limit", default=None,
              help="Memory each worker (and the reference, and the runner while it reads your files) may allocate, "
                   "e.g. 4G, at most 1024T; beyond it the cell FAILs with 'out of memory'. Default: physical memory, at least 4G.")
@click.option("--resume", type=REPORT_FOLDER,
              help="Report folder of a killed or interrupted run: keep its finished cells, run only the missing ones.")
@click.option("--require", default="", help="Comma-separated targets that must run (not only SKIP), else exit 1.")
@click.option("--env", default=None,
              help="Gymnasium id (e.g. CartPole-v1) or module:Class: every predicting cell drives episodes with its runtime in the loop.")
@click.option("--episodes", default=None, type=int, help="Episodes per cell with --env.  [default: 10]")
@click.option("--env-kwargs", default=None, help="JSON object of keyword arguments for the environment.")
@click.option("--clip-actions/--no-clip-actions", default=None,
              help="Clip continuous actions to the action space before stepping (reported per cell).  [default: no]")
@click.option("--return-tolerance", default=None,
              help="How much worse the paired mean return may be than the reference's: 5% or 0.05 (a fraction of "
                   "|reference mean return|, at most 1; default 5%) or abs:10 (return units).")
@click.option("--trajectory", type=click.Path(path_type=Path),
              help="Recorded observations [T, *obs] (.npy) replayed open loop instead of an env: per-step drift along it.")
@click.option("--initial-state", type=click.Path(path_type=Path),
              help="Recurrent state each episode starts from (.npz: one array per state input); default zeros.")
@BATCH_AXIS_OPTION
@click.option("--diagnose", is_flag=True, help="For cells that FAIL/WARN on drift: the first node whose output leaves the float64 reference.")
@click.option("--assist", is_flag=True, help="For FAILed cells: try graph preparations (the diagnosed node kept in fp32, onnxsim, opset 17, rewrites) on the same target; "
              "those that change the model's interface are refused.")
@click.option("--candidate", "candidate_paths", multiple=True, type=click.Path(path_type=Path),
              help="Another model with MODEL's interface (e.g. a distilled student), run through the same grid and judged "
                   "against MODEL's float64 reference (repeatable).")
@click.option("--settings", "settings_specs", multiple=True,
              help="Runtime settings grid, TARGET:KNOB=V1,V2 (repeatable; TARGET may be a glob): ort-cpu/ort-cuda threads=N "
                   "and opt=disable|basic|extended|all; tflite threads=N and xnnpack=on|off. A knob a target lacks is not run on it.")
@click.option("--source", "source_spec", default=None, metavar="SPEC",
              help="The policy as its training framework runs it, as one more column (export parity, the contract "
                   "difference named, returns, latency): sb3:PATH.zip, torch:MODULE:ATTR, torchscript:PATH.pt or "
                   "python:MODULE:FUNC. Loading it executes your own code and checkpoint, as training did; no other "
                   "input is ever executed or unpickled.")
@click.option("--source-python", default=None, metavar="PYTHON",
              help="Interpreter of the training environment that runs --source (it needs numpy and the framework; "
                   "default: this one).")
@click.option("--source-normalize", type=click.Path(path_type=Path), default=None,
              help="Observation statistics applied before --source, as in deployment: SB3 VecNormalize file, or .npz "
                   "with mean and var (optional epsilon, clip_obs).")
@click.option("--budget", "budget_specs", multiple=True,
              help="TARGET=METRIC:VALUE the decision must meet (repeatable; '*' globs): p50:200us, p99:2ms (smallest timed "
                   "batch), size:1MB.")
@click.option("--prefer", type=click.Choice(["latency", "size", "accuracy"]), default="latency", show_default=True,
              help="Among configurations meeting every budget, ship the fastest, the smallest or the most accurate.")
@click.option("--json", "as_json", is_flag=True,
              help="Also print the verdict counts and the per-target decision (the ship table) as JSON on stdout.")
@FAIL_ON_OPTION
@BASELINE_OPTION
@LATENCY_THRESHOLD_OPTION
@DRIFT_FACTOR_OPTION
@ALLOW_DIFFERENT_INPUTS_OPTION
@BROWSER_ENDPOINT_OPTION
@BROWSER_PATH_OPTION
def run(model, targets, skip, variants, precisions, obs, n_obs, seed, batch_sizes, warmup, iters, threads, tolerance, tie_margin,
        min_agreement, timeout, out, host_label, memory_limit, resume, require, env, episodes, env_kwargs, clip_actions,
        return_tolerance, trajectory, initial_state, batch_axis, diagnose, assist, candidate_paths, settings_specs, source_spec,
        source_python, source_normalize, budget_specs, prefer, as_json, fail_on, baseline, latency_threshold, drift_factor,
        allow_different_inputs):
    """Run the matrix on MODEL and write the report."""
    from . import batch_axes
    from . import candidates as candidate_models
    from . import decide, isolation
    from . import model as model_loader
    from . import results as schema
    from .merge import shard_path as merge_shard_path
    from .orchestrate import RunConfig, lock_out
    from .orchestrate import run as run_matrix

    thresholds = _thresholds(drift_factor, latency_threshold)
    target_names = _target_names(targets, skip)
    required = _required(require, target_names)
    limit = options.memory_size(memory_limit) if memory_limit else options.default_memory_limit()
    budgets = decide.parse_budgets(list(budget_specs))
    decide.check_budget_targets(budgets, target_names)
    settings_grid = _settings_grid(list(settings_specs), target_names)
    settings = RunConfig(  # cheap option checks first, the model (slow to load) last
        targets=target_names,
        variants=_variants(_variants_option(variants, precisions)),
        out=_out_dir(out, resume, model),
        observations=_observations_file(obs),
        n_obs=options.at_least(n_obs, 1, "--n-obs"),
        seed=options.at_least(seed, 0, "--seed"),
        batch_sizes=_ints(batch_sizes, "--batch-sizes"),
        warmup=options.at_least(warmup, 0, "--warmup"),
        iters=options.at_least(iters, 1, "--iters"),
        threads=options.at_least(threads, 1, "--threads"),
        timeout_s=options.seconds(timeout, "--timeout"),
        tolerances=_tolerances(list(tolerance)),
        host_label=host_label,
        tie_margin=_tie_margin(tie_margin),
        min_agreement=_min_agreement(min_agreement),
        memory_limit=limit,
        resume=resume is not None,
        diagnose=diagnose,
        assist=assist,
        settings_grid=settings_grid,
        model=_load_model(model, limit, batch_axes.parse_given(batch_axis)),
        batch_axes_given=batch_axes.parse_given(batch_axis),
    )
    model_loader.check_declared_sizes(settings.model, limit, 1 if obs else n_obs)
    rollout_options = {"env": env, "episodes": episodes, "env_kwargs": env_kwargs, "clip_actions": clip_actions,
                       "return_tolerance": return_tolerance, "trajectory": trajectory, "initial_state": initial_state}
    with isolation.capped_runner(limit, "reading the candidates, trajectory and initial state"):
        settings.candidates = candidate_models.load_all(settings.model, list(candidate_paths))
        settings.rollout, settings.return_tolerance = _rollout_settings(settings.model, seed, rollout_options, settings.limits)
    settings.source = _source_settings(source_spec, source_python, source_normalize, settings.model, limit, settings.timeout_s)
    options.writable_dir(settings.out)
    baseline_results = schema.load(merge_shard_path(baseline)) if baseline else None  # a bad baseline fails first
    with lock_out(settings.out):
        try:
            results = run_matrix(settings, console)
        except OSError as error:  # a full disk (or read-only cache) before any cell ran: cells handle their own
            raise InputError(f"cannot write {error.filename or settings.out}: {error.strerror or error}") from None
        results.settings["decision"] = {"budgets": list(budget_specs), "prefer": prefer}
        results.decision = decide.decide_all(results, budgets, prefer)
        _finish(results, settings.out, fail_on, baseline_results, thresholds, required, as_json, allow_different_inputs,
                own_run=True)


def _load_model(path: Path, limit: int, given_batch_axes: dict[str, int]):
    """The model, read by the runner itself: under the run's memory cap (matrix.isolation.capped_runner)."""
    from . import isolation
    from . import model as model_loader

    with isolation.capped_runner(limit, f"reading the model {path}"):
        return model_loader.load(path, given_batch_axes, limit_bytes=limit)


def _settings_grid(specs: list[str], target_names: list[str]):
    import targets as registry

    from . import grid

    return grid.build(grid.parse(specs), [registry.get(name) for name in target_names])


def _observations_file(path: Path | None) -> Path | None:
    """--obs is a regular file (not a FIFO, a device or a folder): checked before anything reads it."""
    from . import userfiles

    if path is not None:
        userfiles.check_regular(path, "observation")
    return path


def _out_dir(out: Path | None, resume: Path | None, model: Path) -> Path:
    """--resume DIR continues in DIR; --out, when also given, must name the same folder."""
    if resume is None:
        return out or Path("reports") / model.stem
    if out is not None and out.resolve() != resume.resolve():
        raise InputError(f"--resume {resume} and --out {out}: a resumed run writes to the folder it resumes")
    return resume


def _required(value: str, target_names: list[str]) -> list[str]:
    names = _target_names(value, option="--require") if value else []
    missing = [name for name in names if name not in target_names]
    if missing:
        raise InputError(f"--require {missing[0]}: that target is not in --targets")
    return names


def _thresholds(drift_factor: float, latency_threshold: float):
    from .compare import Thresholds

    return Thresholds(options.non_negative(drift_factor, "--drift-factor"),
                      options.non_negative(latency_threshold, "--latency-threshold"))


def _source_settings(text: str | None, python: str | None, normalize: Path | None, info, memory_limit: int,
                     timeout_s: float):
    """--source checked before the run: its form, the model's single input, and that its interpreter has the framework."""
    if text is None:
        if python or normalize:
            raise InputError("--source-python and --source-normalize need --source")
        return None
    from . import source

    spec = source.parse(text, python, normalize)
    source.check_model(info)
    source.preflight(spec, memory_limit, timeout_s)
    return spec


def _rollout_settings(info, seed: int, given: dict, limits):
    """The rollout plan (None without --env/--trajectory) and the return tolerance, checked against the model."""
    from . import env_check, rollouts
    from .rules import DEFAULT_RETURN_TOLERANCE, ReturnTolerance

    chosen = {key: value for key, value in given.items() if value is not None}
    return_tolerance = ReturnTolerance.parse(str(chosen.get("return_tolerance", DEFAULT_RETURN_TOLERANCE)))
    env, trajectory = chosen.get("env"), chosen.get("trajectory")
    if env and trajectory:
        raise InputError("--env and --trajectory exclude each other: closed loop with an env, or open loop along a recording")
    if not env and not trajectory:
        given = sorted(key for key in ("episodes", "env_kwargs", "clip_actions", "initial_state") if chosen.get(key) is not None)
        if given:
            raise InputError(f"--{given[0].replace('_', '-')} needs --env (an environment to drive)")
        return None, return_tolerance
    env_kwargs = chosen.get("env_kwargs", "{}")
    episodes = options.at_least(chosen.get("episodes", 10), 1, "--episodes")
    plan = rollouts.plan_for(
        info, env=env or "", episodes=episodes, seed=seed, env_kwargs=rollouts.parse_env_kwargs(env_kwargs),
        clip_actions=bool(chosen.get("clip_actions", False)),
        trajectory=str(Path(trajectory).resolve()) if trajectory else "",
    )
    if chosen.get("initial_state"):
        rollouts.set_initial_state(plan, Path(chosen["initial_state"]), limits.memory_limit)
    env_check.check(plan, limits)  # the environment is made in a guarded step: under --timeout and the cap
    return plan, return_tolerance


@app.command()
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=REPORT_FOLDER, required=True, help="Folder of the merged report.")
@FAIL_ON_OPTION
@BASELINE_OPTION
@LATENCY_THRESHOLD_OPTION
@DRIFT_FACTOR_OPTION
@ALLOW_DIFFERENT_INPUTS_OPTION
def merge(shards, out, fail_on, baseline, latency_threshold, drift_factor, allow_different_inputs):
    """Merge SHARDS (results.json files or report folders, one per host) into one report."""
    from . import results as schema
    from .merge import merge as merge_shards
    from .merge import shard_path as merge_shard_path

    from .decide import decide_all, parse_budgets
    from .orchestrate import lock_out

    baseline_results = schema.load(merge_shard_path(baseline)) if baseline else None
    thresholds = _thresholds(drift_factor, latency_threshold)
    merged = merge_shards(list(shards), allow_different_inputs)
    asked = merged.settings.get("decision", {})  # the first shard's budgets decide over every host's cells
    merged.decision = decide_all(merged, parse_budgets(list(asked.get("budgets", []))), asked.get("prefer", "latency"))
    with lock_out(options.writable_dir(out)):  # never replace the report of a run still writing there
        _finish(merged, out, fail_on, baseline_results, thresholds, allow_different_inputs=allow_different_inputs)


@app.command()
@click.option("--baseline", type=click.Path(path_type=Path), required=True, help="Earlier results.json (or its folder).")
@click.option("--current", type=click.Path(path_type=Path), required=True, help="Newer results.json (or its folder).")
@LATENCY_THRESHOLD_OPTION
@DRIFT_FACTOR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the regressions as a JSON list on stdout.")
@ALLOW_DIFFERENT_INPUTS_OPTION
def compare(baseline, current, latency_threshold, drift_factor, as_json, allow_different_inputs):
    """Regressions of CURRENT against BASELINE, per cell (exit 1 if any)."""
    from . import results as schema
    from .compare import compare as compare_results
    from .merge import shard_path as merge_shard_path

    before, after = schema.load(merge_shard_path(baseline)), schema.load(merge_shard_path(current))
    found = compare_results(before, after, _thresholds(drift_factor, latency_threshold), allow_different_inputs)
    if as_json:
        _print_json([regression.model_dump(mode="json") for regression in found])
    else:
        _print_regressions(found)
        if not found:
            console.print("[green]no regressions[/]")
    sys.exit(1 if found else 0)


def _finish(results, out: Path, fail_on: str, baseline, thresholds, required: list[str] = (), as_json: bool = False,
            allow_different_inputs: bool = False, own_run: bool = False) -> None:
    """Compare with the baseline, write the report, print the tally and exit with the verdict (130/143 when
    this run itself was interrupted; an interrupted shard in a merge is shown in the report, not the exit code)."""
    from . import results as schema
    from .compare import compare as compare_results
    from .decide import summary_lines
    from .report import write_all

    if baseline is not None:
        try:
            results.regressions = compare_results(baseline, results, thresholds, allow_different_inputs)
        except InputError:  # refused (different inputs): the run's own report is still written
            write_all(results, out)
            raise
    results.required_not_run = [name for name in required
                                if all(c.verdict == "SKIP" for c in results.cells if c.target == name)]
    try:
        index = write_all(results, out)
    except OSError as error:  # a full disk: the earlier report stays whole (files are replaced atomically)
        raise InputError(f"cannot write the report to {out}: {error.strerror or error}") from None
    counts = {v: sum(c.verdict == v for c in results.cells) for v in schema.VERDICTS}
    if _verbosity() > 0:
        for cell in results.cells:
            console.print(f"{cell.verdict:4} {cell.target} {cell.variant}: {escape('; '.join(cell.reasons))}", highlight=False)
    console.print(" ".join(f"{k} {n}" for k, n in counts.items()))
    for line in summary_lines(results):
        console.print(escape(line), highlight=False)
    _print_regressions(results.regressions)
    console.print(f"report: [bold]{index}[/]")
    if as_json:
        _print_json({"report": str(index), "counts": counts, "observations": results.model.get("observation_source"),
                     "required_not_run": results.required_not_run,
                     "decision": [decision.model_dump(mode="json") for decision in results.decision]})
    if own_run and results.interrupted is not None:
        sys.exit(143 if results.interrupted.signal == "SIGTERM" else 130)
    threshold = {"fail": ("FAIL",), "warn": ("FAIL", "WARN"), "skip": ("FAIL", "SKIP"), "never": ()}[fail_on]
    failed = any(c.verdict in threshold for c in results.cells)
    for name in results.required_not_run:  # an error: said even under -q, which silences the console
        print(f"policy-matrix: required target {name} did not run (every cell SKIPped)", file=sys.stderr)
    sys.exit(1 if failed or results.regressions or results.required_not_run else 0)


def _print_regressions(found) -> None:
    for regression in found:
        console.print(f"[red]regression[/] {escape(str(regression))}", highlight=False)


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

    from .runtime_versions import release_number

    if name not in registry.REGISTRY:
        raise InputError(f"--versions: unknown target {name!r}; known: {', '.join(registry.REGISTRY)}")
    target = registry.get(name)
    try:
        offered = versions.supported_versions(target)
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
@BATCH_AXIS_OPTION
def lint(model: Path, as_json: bool, batch_axis: tuple[str, ...]) -> None:
    """The deployment-readiness lints alone (exit 1 if any is an error)."""
    from dataclasses import asdict

    from . import model as model_loader
    from .batch_axes import parse_given
    from .lint import lint as lint_model

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
                     "two neighbours side by side.")
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
@BROWSER_ENDPOINT_OPTION
@BROWSER_PATH_OPTION
def bisect(target, release_range, model, measure, threshold, variant, out, obs, n_obs, seed, batch_sizes, warmup, iters,
           threads, tolerance, timeout, memory_limit, env, episodes, env_kwargs):
    """The first release of TARGET's runtime between OLD and NEW where MODEL's MEASURE changed, in log2 steps."""
    from . import release_bisect as releases
    from .orchestrate import RunConfig, lock_out

    old, new = releases.parse_range(release_range)
    chosen = releases.MEASURES[measure]
    releases.check_threshold(chosen, threshold)
    if measure == "return" and not env:
        raise InputError("--measure return needs --env (an environment whose episodes give a return)")
    names = _target_names(target)
    if len(names) != 1 or "@" in names[0]:
        raise InputError(f"bisect: {target!r}: name one target, without @RELEASE (the range gives the releases)")
    offered, floor = releases.offered(names[0])
    limit = options.memory_size(memory_limit) if memory_limit else options.default_memory_limit()
    config = RunConfig(
        targets=names, variants=_one_variant(variant), out=out or Path("reports") / f"bisect-{model.stem}", observations=obs,
        n_obs=options.at_least(n_obs, 1, "--n-obs"), seed=options.at_least(seed, 0, "--seed"),
        batch_sizes=_ints(batch_sizes, "--batch-sizes"), warmup=options.at_least(warmup, 0, "--warmup"),
        iters=options.at_least(iters, 1, "--iters"), threads=options.at_least(threads, 1, "--threads"),
        timeout_s=options.seconds(timeout, "--timeout"), tolerances=_tolerances(list(tolerance)), memory_limit=limit,
        model=_load_model(model, limit, {}),
    )
    config.rollout, config.return_tolerance = _rollout_settings(
        config.model, seed, {"env": env, "episodes": episodes, "env_kwargs": env_kwargs}, config.limits)
    span = releases.releases_between(offered, old, new, floor)
    options.writable_dir(config.out)
    with lock_out(config.out):
        found = releases.bisect(config, names[0], span, chosen, threshold, console)
    sys.exit(0 if found else 1)


app.add_command(frameworks_command)


def _one_variant(value: str) -> list[str]:
    chosen = _variants(value)
    if len(chosen) != 1:
        raise InputError(f"--variant {value!r}: a bisect compares one variant's cell, e.g. --variant fp32")
    return chosen


def main() -> None:
    """Console entry point: user errors are one line on stderr and exit code 2."""
    signal.signal(signal.SIGTERM, raise_terminated)  # like Ctrl-C: report what finished, leave nothing running
    # Python installs its Ctrl-C handler only when SIGINT was not ignored at start; a background job of a
    # non-interactive shell inherits it ignored, and an interrupt would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
