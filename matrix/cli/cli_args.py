"""The `run` command's options in argument groups (Polygraphy's `tools/args` pattern, with click).

Each group adds its options to a command and parses their values into its part of the run's
configuration (`orchestrate.RunConfig`): `run_config` asks every group in turn, cheap checks first
and the model (slow to load) last, so a bad value is one line before any work starts. Budgets and
the preference (`decide.Request`) and the run's ending (exit rule, baseline) are parts like any other,
decided once here, not again in `run`, `merge` or the report.

Only click and the option checks are imported at start-up: `--help` stays fast.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from .. import options
from ..errors import InputError
from ..judge.rules import DEFAULT_MIN_AGREEMENT, DEFAULT_TIE_MARGIN


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
    "--baseline", type=click.Path(path_type=Path),
    help="Earlier results.json (or its report folder) to flag regressions against (exit 1 if any)."
)
BATCH_AXIS_OPTION = click.option(
    "--batch-axis", "batch_axis", multiple=True,
    help="NAME=AXIS: the batch axis of an input where inference gets it wrong (repeatable; -1: no batch, fed whole). "
         "Inferred otherwise: axis 0 of the first input, a recurrent pair's axis (an LSTM state [layers, batch, hidden]: 1), "
         "the observation's batch symbol."
)
SIDE_INPUT_OPTION = click.option(
    "--side-input", "side_input", multiple=True, metavar="NAME=VALUE",
    help="The value of an input fed whole beside the observation (no batch axis: a rank-0 deterministic, rng [1]), as "
         "JSON: deterministic=true, rng=[0.5] (repeatable). It replaces the seeded value in every observation row and is "
         "fed on every --env/--trajectory step; --env needs one for each such input."
)
BASELINE_MISMATCH_OPTION = click.option(
    "--baseline-mismatch", type=click.Choice(("refuse", "note")), default="refuse", show_default=True,
    help="A --baseline that cannot be read or compared (another model, no host in common, other inputs or judging): refuse it "
         "(exit 2), or note it: the report and summary.md say why nothing was compared and the run is judged on its own "
         "(a nightly whose model or options changed, so that its next night compares with this one)."
)
LATENCY_THRESHOLD_OPTION = click.option(
    "--latency-threshold", default=0.25, show_default=True, help="p50 slowdown (fraction) that counts as a regression."
)
DRIFT_FACTOR_OPTION = click.option(
    "--drift-factor", default=10.0, show_default=True, help="Drift growth factor that counts as a regression."
)
ALLOW_DIFFERENT_INPUTS_OPTION = click.option(
    "--allow-different-inputs", is_flag=True,
    help="Compare or merge results measured on different observations, episodes or judging options (refused by "
         "default); the difference is printed in every regression line."
)



class Group:
    """One argument group: `options` (click decorators, in --help order) and `parse`, which takes the command's
    values (by parameter name) and returns its part of the run configuration."""

    options: tuple = ()

    def __call__(self, command):
        for option in reversed(self.options):
            command = option(command)
        return command

    def parse(self, values: dict) -> dict:
        raise NotImplementedError


class Selection(Group):
    """Which cells: targets (and their releases), variants, runtime settings; which targets must run."""

    options = (
        click.option("--targets", default="all", show_default=True,
                  help="Comma-separated target names or globs (ort-web-*), or 'all'. NAME@VERSION runs that release of the "
                       "runtime beside the default (ort-cpu@1.20.1,ort-cpu); `policy-matrix targets --versions NAME` lists them."),
        click.option("--skip", default="", help="Comma-separated target names or globs to leave out."),
        click.option("--variants", default=",".join(options.DEFAULT_VARIANTS), show_default=True,
                  help="Comma-separated variants (the artifact's precision): fp32, fp16, int8."),
        click.option("--precisions", default=None, hidden=True, help="Old name of --variants, still accepted."),
        click.option("--settings", "settings_specs", multiple=True,
                  help="Runtime settings grid, TARGET:KNOB=V1,V2 (repeatable; TARGET may be a glob): ort-cpu/ort-cuda threads=N "
                       "and opt=disable|basic|extended|all; tflite threads=N and xnnpack=on|off. A knob a target lacks is not run on it."),
        click.option("--require", default="", help="Comma-separated targets that must run (not only SKIP), else exit 1."),
    )

    def parse(self, values: dict) -> dict:
        names = target_names(values["targets"], values["skip"])
        return {"targets": names, "required": _required(values["require"], names),
                "settings_grid": _settings_grid(list(values["settings_specs"]), names),
                "variants": variants(_variants_option(values["variants"], values["precisions"]))}


class Decision(Group):
    """What to ship per target: budgets and the preference among configurations that meet them."""

    options = (
        click.option("--budget", "budget_specs", multiple=True,
                  help="TARGET=METRIC:VALUE the decision must meet (repeatable; '*' globs): p50:200us, p99:2ms (smallest timed "
                       "batch), size:1MB."),
        click.option("--prefer", type=click.Choice(["latency", "size", "accuracy"]), default="latency", show_default=True,
                  help="Among configurations meeting every budget, ship the fastest, the smallest or the most accurate."),
    )

    def parse(self, values: dict, targets: list[str]) -> dict:
        from ..decide import decide

        request = decide.Request(tuple(values["budget_specs"]), values["prefer"])
        decide.check_budget_targets(request.budgets, targets)
        return {"decision": request}


class Limits(Group):
    """What bounds every process that touches the model."""

    options = (
        click.option("--timeout", default=options.DEFAULT_TIMEOUT_S, show_default=True, help="Seconds a cell may take before it is killed and FAILs (at most 10^6)."),
        click.option("--memory-limit", default=None,
                  help="Memory each worker (and the reference, and the runner while it reads your files) may allocate, "
                       "e.g. 4G, at most 1024T; beyond it the cell FAILs with 'out of memory'. Default: physical memory, at least 4G."),
    )

    def parse(self, values: dict) -> dict:
        limit = options.memory_size(values["memory_limit"]) if values["memory_limit"] else options.default_memory_limit()
        return {"memory_limit": limit, "timeout_s": options.seconds(values["timeout"], "--timeout")}


class Output(Group):
    """Where the report goes (or which run to resume) and the host's name in it."""

    options = (
        click.option("--out", type=REPORT_FOLDER, help="Report folder (default reports/<model name>): new, empty or an earlier report; a folder of other files is refused."),
        click.option("--resume", type=REPORT_FOLDER,
                  help="Report folder of a killed or interrupted run: keep its finished cells, run only the missing ones."),
        click.option("--host-label", default="", help="Name of this host in merged reports (default os-arch)."),
    )

    def parse(self, values: dict, model: Path) -> dict:
        return {"out": _out_dir(values["out"], values["resume"], model), "resume": values["resume"] is not None,
                "host_label": values["host_label"]}


class Observations(Group):
    """The inputs every cell is fed: recorded or seeded, and the batch axis of each input."""

    options = (
        click.option("--obs", type=click.Path(path_type=Path), help="Recorded observations (.npy for one input, .npz keyed by input name)."),
        click.option("--n-obs", default=options.DEFAULT_N_OBS, show_default=True, help="Size of the seeded observation set when --obs is not given."),
        click.option("--seed", default=options.DEFAULT_SEED, show_default=True,
                  help="Seed of the generated observation set, and of the first episode (episode i resets with seed+i)."),
        BATCH_AXIS_OPTION,
        SIDE_INPUT_OPTION,
    )

    def parse(self, values: dict) -> dict:
        from ..inputs.batch_axes import parse_given

        return {"observations": _observations_file(values["obs"]), "n_obs": options.at_least(values["n_obs"], 1, "--n-obs"),
                "seed": options.at_least(values["seed"], 0, "--seed"), "batch_axes_given": parse_given(values["batch_axis"]),
                "side_inputs": side_inputs_given(values["side_input"])}


class Timing(Group):
    """How latency is measured."""

    options = (
        click.option("--batch-sizes", default=",".join(map(str, options.DEFAULT_BATCH_SIZES)), show_default=True, help="Batch sizes to time."),
        click.option("--warmup", default=options.DEFAULT_WARMUP, show_default=True, help="Untimed calls before timing."),
        click.option("--iters", default=options.DEFAULT_ITERS, show_default=True, help="Timed calls per batch size (what-to-ship compares p99 tails from 101 on)."),
        click.option("--threads", default=options.DEFAULT_THREADS, show_default=True, help="Intra-op threads given to each runtime."),
    )

    def parse(self, values: dict) -> dict:
        return {"batch_sizes": ints(values["batch_sizes"], "--batch-sizes"),
                "warmup": options.at_least(values["warmup"], 0, "--warmup"),
                "iters": options.at_least(values["iters"], 1, "--iters"),
                "threads": options.at_least(values["threads"], 1, "--threads")}


class Judging(Group):
    """How a cell is judged (the run's one Judge is built from these)."""

    options = (
        click.option("--tolerance", multiple=True,
                  help="TARGET:VARIANT=ATOL[,rtol=RTOL]: |y - y_ref| <= ATOL + RTOL*|y_ref| per element (repeatable; '*' "
                       "wildcards; atol also from a [tolerance] table). Defaults: fp32 1e-4/1e-5, fp16 2e-2/1e-3, int8 0.25/1e-2."),
        click.option("--tie-margin", default=DEFAULT_TIE_MARGIN, show_default=True,
                  help="Discrete actions: a flip counts only where the reference's top-1 minus top-2 logit is above this."),
        click.option("--min-agreement", default=DEFAULT_MIN_AGREEMENT, show_default=True,
                  help="Discrete actions: flips that bring agreement with the reference below this share FAIL the cell (above it: WARN)."),
    )

    def parse(self, values: dict) -> dict:
        return {"tolerances": tolerances(list(values["tolerance"])), "tie_margin": _tie_margin(values["tie_margin"]),
                "min_agreement": _min_agreement(values["min_agreement"])}


class Behaviour(Group):
    """Episodes with the runtime in the loop (--env) or a recorded trajectory replayed (--trajectory)."""

    options = (
        click.option("--env", default=None,
                  help="Gymnasium id (e.g. CartPole-v1) or module:Class: every predicting cell drives episodes with its runtime "
                       "in the loop (a Dict observation: each key feeds the input of that name)."),
        click.option("--episodes", default=None, type=int, help="Episodes per cell with --env.  [default: 10]"),
        click.option("--env-kwargs", default=None, help="JSON object of keyword arguments for the environment."),
        click.option("--clip-actions/--no-clip-actions", default=None,
                  help="Clip continuous actions to the action space before stepping (reported per cell).  [default: no]"),
        click.option("--return-tolerance", default=None,
                  help="How much worse the paired mean return may be than the reference's: 5% or 0.05 (a fraction of "
                       "|reference mean return|, at most 1; default 5%) or abs:10 (return units)."),
        click.option("--trajectory", type=click.Path(path_type=Path),
                  help="Recorded observations [T, *obs] (.npy; several observation inputs: .npz, one array per input) replayed "
                       "open loop instead of an env: per-step drift along it."),
        click.option("--initial-state", type=click.Path(path_type=Path),
                  help="Recurrent state each episode starts from (.npz: one array per state input); default zeros."),
    )
    NAMES = ("env", "episodes", "env_kwargs", "clip_actions", "return_tolerance", "trajectory", "initial_state")

    def parse(self, values: dict, model, seed: int, limits, side_inputs: dict) -> dict:
        """The rollout plan and return tolerance, and the side inputs' values: --side-input's, and where it leaves one
        out, the value a --trajectory .npz records (fed in the loop and in the parity rows alike)."""
        if values["trajectory"] is not None:
            from ..run import rollouts

            side_inputs = {**rollouts.recorded_side_values(values["trajectory"], model, side_inputs, limits.memory_limit),
                           **side_inputs}
        plan, return_tolerance = rollout_options(model, seed, {name: values[name] for name in self.NAMES}, limits,
                                                 side_inputs)
        return {"rollout": plan, "return_tolerance": return_tolerance, "side_inputs": side_inputs}


class Candidates(Group):
    """More models with the same interface through the same grid, judged against MODEL's reference."""

    options = (
        click.option("--candidate", "candidate_paths", multiple=True, type=click.Path(path_type=Path),
                  help="Another model with MODEL's interface (e.g. a distilled student), run through the same grid and judged "
                       "against MODEL's float64 reference (repeatable)."),
    )

    def parse(self, values: dict, model) -> dict:
        from ..run import candidates

        return {"candidates": candidates.load_all(model, list(values["candidate_paths"]))}


class Source(Group):
    """The policy as its training framework runs it, one more column."""

    options = (
        click.option("--source", "source_spec", default=None, metavar="SPEC",
                  help="The policy as its training framework runs it, as one more column (export parity, the contract "
                       "difference named, returns, latency): sb3:PATH.zip, torch:MODULE:ATTR, torchscript:PATH.pt or "
                       "python:MODULE:FUNC. Loading it executes your own code and checkpoint, as training did; no other "
                       "input is ever executed or unpickled."),
        click.option("--source-python", default=None, metavar="PYTHON",
                  help="Interpreter of the training environment that runs --source (it needs numpy and the framework; "
                       "default: this one)."),
        click.option("--source-normalize", type=click.Path(path_type=Path), default=None,
                  help="Observation statistics applied before --source, as in deployment: SB3 VecNormalize file, or .npz "
                       "with mean and var (optional epsilon, clip_obs); per key for a Dict observation (mean/KEY, var/KEY)."),
    )

    def parse(self, values: dict, model, memory_limit: int, timeout_s: float) -> dict:
        return {"source": _source_option(values["source_spec"], values["source_python"], values["source_normalize"],
                                           model, memory_limit, timeout_s)}


class Assist(Group):
    """After the cells: the first divergent node of drifting cells, graph preparations for failing ones."""

    options = (
        click.option("--diagnose", is_flag=True, help="For the first model's cells that FAIL/WARN on drift: the first node whose output leaves the float64 reference."),
        click.option("--assist", is_flag=True, help="For the first model's FAILed cells: try graph preparations (the diagnosed node kept in fp32, the rewrite a known failure names, onnxsim, opset 17, rewrites) on the same target; "
                  "those that change the model's interface are refused. A fix is judged on drift: it drives no --env episodes."),
    )

    def parse(self, values: dict) -> dict:
        return {"diagnose": values["diagnose"], "assist": values["assist"]}


class Ending(Group):
    """How a run (or a merge) ends: the baseline it is compared with, the exit rule, JSON on stdout."""

    options = (FAIL_ON_OPTION, BASELINE_OPTION, BASELINE_MISMATCH_OPTION, LATENCY_THRESHOLD_OPTION, DRIFT_FACTOR_OPTION,
               ALLOW_DIFFERENT_INPUTS_OPTION)

    def parse(self, values: dict) -> dict:
        return {"fail_on": values["fail_on"], "baseline": values["baseline"], "baseline_mismatch": values["baseline_mismatch"],
                "thresholds": thresholds(values["drift_factor"], values["latency_threshold"]),
                "allow_different_inputs": values["allow_different_inputs"]}


SELECTION, OBSERVATIONS, TIMING, JUDGING, LIMITS, OUTPUT, BEHAVIOUR, ASSIST, CANDIDATES, SOURCE, DECISION, ENDING = (
    Selection(), Observations(), Timing(), Judging(), Limits(), Output(), Behaviour(), Assist(), Candidates(), Source(),
    Decision(), Ending())
RUN_GROUPS = (SELECTION, OBSERVATIONS, TIMING, JUDGING, LIMITS, OUTPUT, BEHAVIOUR, ASSIST, CANDIDATES, SOURCE, DECISION)


def run_config(model_path: Path, values: dict):
    """The run's configuration from `run`'s values: each group's part, cheap checks first, the model last, then
    what needs the model (its declared sizes, candidates, rollout plan, source column) under the memory cap."""
    from ..run import isolation
    from ..inputs import model as model_loader
    from ..run.orchestrate import RunConfig

    selection = SELECTION.parse(values)
    parts = {**selection, **DECISION.parse(values, selection["targets"]), **LIMITS.parse(values),
             **OUTPUT.parse(values, model_path), **OBSERVATIONS.parse(values), **TIMING.parse(values),
             **JUDGING.parse(values), **ASSIST.parse(values)}
    model = load_model(model_path, parts["memory_limit"], parts["batch_axes_given"])
    config = RunConfig(model=model, **{**parts, "side_inputs": side_input_values(parts["side_inputs"], model)})
    model_loader.check_declared_sizes(config.model, config.memory_limit, 1 if config.observations else config.n_obs)
    model_loader.check_batch_sizes(config.model, config.memory_limit, config.batch_sizes)
    with isolation.capped_runner(config.memory_limit, "reading the candidates, trajectory and initial state"):
        read = {**CANDIDATES.parse(values, config.model),
                **BEHAVIOUR.parse(values, config.model, config.seed, config.limits, config.side_inputs)}
    return replace(config, **read, **SOURCE.parse(values, config.model, config.memory_limit, config.timeout_s))


def csv_items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def ints(value: str, option: str) -> list[int]:
    try:
        numbers = [int(item) for item in csv_items(value)]
    except ValueError:
        raise InputError(f"{option} {value!r}: expected comma-separated integers, e.g. 1,64") from None
    if not numbers or min(numbers) < 1:
        raise InputError(f"{option} {value!r}: batch sizes must be positive")
    return numbers


def target_names(value: str, skip: str = "", option: str = "--targets") -> list[str]:
    import targets as registry
    from targets.versions import BadRelease

    from ..run.selection import select_targets

    chosen = select_targets(value, skip, list(registry.REGISTRY), option)
    for label in chosen:  # a malformed @release, or one on a target that has none, is bad input
        try:
            registry.get(label)
        except BadRelease as error:
            raise InputError(str(error)) from None
    return chosen


def variants(value: str) -> list[str]:
    from targets.base import VARIANTS

    names = csv_items(value)
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
    if new == old == ParameterSource.COMMANDLINE and csv_items(variants) != csv_items(precisions):
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


def tolerances(specs: list[str]):
    """Every override (command line or the config's [tolerance] table) is a number >= 0 whose key matches some
    target or variant."""
    from targets.base import VARIANTS

    from ..judge.rules import Tolerances
    from ..runtime_versions import release_key

    tolerances = Tolerances.parse(specs, click.get_current_context().meta.get("config_tolerances", {}))
    for key, value in [*tolerances.overrides.items(), *tolerances.rtol_overrides.items()]:
        where = f"tolerance {key!r}"
        options.tolerance_value(value, where)
        options.tolerance_key(release_key(key, where), _tolerance_targets(), VARIANTS, where)
    return tolerances


def _tolerance_targets() -> list[str]:
    """What a tolerance key may name: every target and the --source column."""
    import targets as registry

    from ..reference import SOURCE_TARGET

    return [*registry.REGISTRY, SOURCE_TARGET]


def load_model(path: Path, limit: int, given_batch_axes: dict[str, int]):
    """The model, read by the runner itself: under the run's memory cap (matrix.run.isolation.capped_runner)."""
    from ..run import isolation
    from ..inputs import model as model_loader

    with isolation.capped_runner(limit, f"reading the model {path}"):
        return model_loader.load(path, given_batch_axes, limit_bytes=limit)


def _settings_grid(specs: list[str], target_names: list[str]):
    import targets as registry

    from ..run import grid

    return grid.build(grid.parse(specs), [registry.get(name) for name in target_names])


def _observations_file(path: Path | None) -> Path | None:
    """--obs is a regular file (not a FIFO, a device or a folder): checked before anything reads it."""
    from .. import userfiles

    if path is not None:
        userfiles.check_regular(path, "observation")
    return path


def side_inputs_given(specs: tuple[str, ...]) -> dict:
    """--side-input NAME=VALUE parsed (its module only when one is given: a plain run never imports it)."""
    if not specs:
        return {}
    from ..inputs import side_inputs

    return side_inputs.parse(specs)


def side_input_values(given: dict, model) -> dict:
    """Each --side-input value as its input takes it (declared dtype and shape), once the model is read."""
    if not given:
        return {}
    from ..inputs import side_inputs

    return side_inputs.conform(given, model)


def _out_dir(out: Path | None, resume: Path | None, model: Path) -> Path:
    """--resume DIR continues in DIR; --out, when also given, must name the same folder."""
    if resume is None:
        # reports/<model name>; a stem of '.' or '..' ('...onnx') would name the folder above, so it keeps its suffix
        return out or Path("reports") / (model.name if model.stem in (".", "..") else model.stem)
    if out is not None and out.resolve() != resume.resolve():
        raise InputError(f"--resume {resume} and --out {out}: a resumed run writes to the folder it resumes")
    return resume


def _required(value: str, selected: list[str]) -> list[str]:
    names = target_names(value, option="--require") if value else []
    missing = [name for name in names if name not in selected]
    if missing:
        raise InputError(f"--require {missing[0]}: that target is not in --targets")
    return names


def thresholds(drift_factor: float, latency_threshold: float):
    from ..decide.compare import Thresholds

    return Thresholds(options.non_negative(drift_factor, "--drift-factor"),
                      options.non_negative(latency_threshold, "--latency-threshold"))


def _source_option(text: str | None, python: str | None, normalize: Path | None, info, memory_limit: int,
                     timeout_s: float):
    """--source checked before the run: its form, the model's inputs (no recurrent state), an .npz normaliser's keys,
    and that its interpreter has the framework."""
    if text is None:
        if python or normalize:
            raise InputError("--source-python and --source-normalize need --source")
        return None
    from ..reference import source

    spec = source.parse(text, python, normalize)
    source.check_model(info)
    source.check_normalizer(spec, info, memory_limit)
    return source.preflight(spec, memory_limit, timeout_s)  # the spec with its checked column process, waiting


def rollout_options(info, seed: int, given: dict, limits, side_inputs: dict):
    """The rollout plan (None without --env/--trajectory) and the return tolerance, checked against the model."""
    from ..run import env_check, rollouts
    from ..judge.rules import DEFAULT_RETURN_TOLERANCE, ReturnTolerance

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
    settings = dict(env=env or "", episodes=episodes, seed=seed, env_kwargs=rollouts.parse_env_kwargs(env_kwargs),
                    clip_actions=bool(chosen.get("clip_actions", False)),
                    trajectory=str(Path(trajectory).resolve()) if trajectory else "")
    try:
        plan = rollouts.plan_for(info, side_inputs, **settings)
    except rollouts.SideValueMissing:
        if env:  # an env whose Dict key is named like that input needs other advice than a value: its check says both
            env_check.check(rollouts.plan_for(info, {**rollouts.stand_in_values(info), **side_inputs}, **settings), limits)
        raise
    if chosen.get("initial_state"):
        rollouts.set_initial_state(plan, Path(chosen["initial_state"]), limits.memory_limit)
    env_check.check(plan, limits)  # the environment is made in a guarded step: under --timeout and the cap
    return plan, return_tolerance

