"""The float64 reference and the development runtime's (ORT CPU fp32) outputs, in their own process:
`python -m matrix.reference_job DIR`.

They evaluate the user's model, so they get the same protection as a cell
(timeout, memory cap, death with the runner): a model with a Loop of 10^12
iterations or one that allocates a gigabyte per call ends this process, not
the run's. Reads DIR/reference_spec.json, writes DIR/reference.npz,
DIR/dev_runtime.npz (when ORT could run it), DIR/rollout.npz (with --env or
--trajectory: the reference's episodes) and DIR/reference.json. When the
observation set is the states the reference visits (matrix/observation_sources.py), the
rollout runs first and the sampled set is written where the spec says.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np

from . import model as model_loader
from . import observation_sources, observations, reference, rollouts
from .errors import InputError
from .protocol import stage_message


def stage(name: str) -> None:
    print(stage_message(name), flush=True)


def main(folder: Path) -> None:
    spec = json.loads((folder / "reference_spec.json").read_text())
    info = model_loader.load(Path(spec["model"]), spec.get("batch_axes_given") or {})  # the user's --batch-axis too
    plan = rollouts.RolloutPlan.from_dict(spec["rollout"]) if spec.get("rollout") else None
    report: dict = {}
    if spec.get("visited_states"):  # the observation set is sampled from this rollout: it runs first
        stage("rollout")
        episodes = _rollout(info, plan, folder, report)
        if episodes is None:
            (folder / "reference.json").write_text(json.dumps(report))
            return
        wanted = spec["visited_states"]
        observations.save(observation_sources.visited_feeds([e.observations for e in episodes], plan, wanted["count"], wanted["multiple"]),
                          Path(spec["observations"]))
    feeds = observations.read(Path(spec["observations"]))
    stage("reference")
    try:
        ref = reference.compute(info, feeds, spec["chunk"])
    except Exception as error:  # the evaluator's own words, for the one line the user sees
        report["error"] = _one_line(error)
        traceback.print_exc(limit=8)
    else:
        save(folder / "reference.npz", {**_prefixed("outputs", ref.outputs), **_prefixed("margins", ref.margins)})
        stage("dev runtime")
        try:
            save(folder / "dev_runtime.npz", _prefixed("outputs", reference.dev_runtime(info, feeds, spec["chunk"])))
        except Exception as error:  # the matrix still runs; that column stays empty
            report["dev_runtime_error"] = _one_line(error)
        if plan is not None and "rollout" not in report:
            stage("rollout")
            _rollout(info, plan, folder, report)
    (folder / "reference.json").write_text(json.dumps(report))


def _rollout(info, plan, folder: Path, report: dict) -> list[rollouts.Episode] | None:
    """The float64 policy drives the cells' episodes here too, under the same guard as the reference;
    its episodes (None when it could not drive the environment; [] open loop)."""
    try:
        measured, arrays = rollouts.reference_drive(info, plan)
    except InputError as error:
        report["rollout_error"] = str(error)
        return None
    save(folder / "rollout.npz", arrays)
    report["rollout"] = measured
    return [] if plan.open_loop else rollouts.episodes_from(arrays, measured)


def save(path: Path, arrays: dict) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as stream:
        np.savez(stream, **arrays)
    partial.replace(path)


def load(path: Path) -> tuple[dict, dict]:
    """(outputs, margins) of a reference.npz or dev_runtime.npz (which has no margins)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    outputs = {k.removeprefix("outputs/"): v for k, v in arrays.items() if k.startswith("outputs/")}
    margins = {k.removeprefix("margins/"): v for k, v in arrays.items() if k.startswith("margins/")}
    return outputs, margins


def _prefixed(prefix: str, arrays: dict) -> dict:
    return {f"{prefix}/{name}": value for name, value in arrays.items()}


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())[:600]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


if __name__ == "__main__":
    main(Path(sys.argv[1]))
