"""The float64 reference and the development runtime's (ORT CPU fp32) outputs, in their own process:
the guarded step "reference" (matrix.run.guarded).

They evaluate the user's model, so they get the same protection as a cell
(timeout, memory cap, death with the runner): a model with a Loop of 10^12
iterations or one that allocates a gigabyte per call ends this process, not
the run's. Writes FOLDER/reference.npz, FOLDER/dev_runtime.npz (when ORT could
run it), FOLDER/rollout.npz (with --env or --trajectory: the reference's
episodes); its answer says what failed ("error", "dev_runtime_error",
"rollout_error") and the rollout's record. When the observation set is the
states the reference visits or the trajectory it replays (matrix/inputs/observation_sources.py),
the rollout runs first and the sampled set, with the recurrent state the
reference carried into each sampled step, is written where the spec says.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import TYPE_CHECKING


from ..inputs import model as model_loader
from ..inputs import observation_sources, observations
from . import reference
from ..errors import InputError, error_line
from ..run.guarded import stage

if TYPE_CHECKING:  # imported by _plan, with --env or --trajectory only
    from ..run import rollouts


def guarded_step(spec: dict, folder: Path) -> dict:
    info = model_loader.load(Path(spec["model"]), spec.get("batch_axes_given") or {})  # the user's --batch-axis too
    plan = _plan(spec)
    report: dict = {}
    if spec.get("visited_states"):  # the observation set is sampled from this rollout: it runs first
        stage("rollout")
        runs = _rollout(info, plan, folder, report)
        if runs is None:
            return report
        wanted = spec["visited_states"]
        observations.save(observation_sources.visited_feeds(runs, plan, wanted["count"], wanted["multiple"]),
                          Path(spec["observations"]))
    feeds = observations.read(Path(spec["observations"]))
    stage("reference")
    try:
        ref = reference.compute(info, feeds, spec["chunk"])
    except Exception as error:  # the evaluator's own words, for the one line the user sees
        report["error"] = reference.error_words(error)
        traceback.print_exc(limit=8)
    else:
        observations.save({**_prefixed("outputs", ref.outputs), **_prefixed("margins", ref.margins)}, folder / "reference.npz")
        stage("dev runtime")
        try:
            observations.save(_prefixed("outputs", reference.dev_runtime(info, feeds, spec["chunk"])), folder / "dev_runtime.npz")
        except Exception as error:  # the matrix still runs; that column stays empty
            report["dev_runtime_error"] = error_line(error)
        if plan is not None and "rollout" not in report:
            stage("rollout")
            _rollout(info, plan, folder, report)
    return report


def _plan(spec: dict) -> rollouts.RolloutPlan | None:
    """The rollout the reference drives, if any. Its module is imported only then: it brings pydantic (the
    trajectory's validation), which a plain reference does without, and so does the fork server's preload
    before this job (matrix/run/forkserver.py)."""
    if not spec.get("rollout"):
        return None
    from ..run import rollouts

    return rollouts.RolloutPlan.from_dict(spec["rollout"])


def _rollout(info, plan: rollouts.RolloutPlan, folder: Path, report: dict) -> list[observations.Feeds] | None:
    """The float64 policy drives the cells' episodes (or replays the trajectory) here too, under the same guard as
    the reference; what it visited per episode, state inputs included (None when it could not drive)."""
    from ..run import rollouts  # loaded by _plan

    try:
        measured, arrays = rollouts.reference_drive(info, plan)
    except InputError as error:
        report["rollout_error"] = str(error)
        return None
    observations.save(arrays, folder / "rollout.npz")
    report["rollout"] = measured
    return rollouts.visited_runs(measured, arrays, plan)


def load(path: Path) -> tuple[dict, dict]:
    """(outputs, margins) of a reference.npz or dev_runtime.npz (which has no margins)."""
    arrays = observations.read(path)
    outputs = {k.removeprefix("outputs/"): v for k, v in arrays.items() if k.startswith("outputs/")}
    margins = {k.removeprefix("margins/"): v for k, v in arrays.items() if k.startswith("margins/")}
    return outputs, margins


def _prefixed(prefix: str, arrays: dict) -> dict:
    return {f"{prefix}/{name}": value for name, value in arrays.items()}
