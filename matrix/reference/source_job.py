"""The source column's worker: `python -m matrix.reference.source_job`, run guarded like a cell.

It starts matrix/reference/source_runner.py in the user's training interpreter (`--source-python`),
checks it, then waits; when the run reaches its column it asks the runner, over one JSON line each way,
to load the policy, predict the observation set at batch 1, drive the run's seeded episodes (the
environment lives here, on the core's side, so the training interpreter needs no Gymnasium) and time
`predict`. The runner is this process's child, in its process group and under its memory cap: the
cell's --timeout ends both. It also evaluates the float64 reference on the observations as the
source's preprocessing would see them (/255, normalised), for matrix.reference.source_fit to name a
contract difference.

Why one process serves both the check and the column: the check imports the framework and the user's
module (SB3 and torch: 2.5-7 CPU s), and so does loading the policy. Started once, while the options are
checked (matrix.reference.source.preflight), the training interpreter imports them once per run; between
its check and its column it waits on its stdin, and its --timeout counts from the column's start.

Its stdin, one JSON line each: {"python", "source", "check"} (this source in that interpreter, checked first when
"check"), then {"folder"} when the column runs (end of input: the run ended without it). Its stdout: the check's answer,
{"check": {"answer": the runner's answer or null, "stderr": its last words}} or {"check": {"start_error"}},
then the stage lines of the guarded protocol. Reads FOLDER/source_spec.json; leaves FOLDER/measurement.json,
FOLDER/outputs.npz (the protocol's cell files, rewritten after every stage) and FOLDER/source.json (what the
source said about itself).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

from targets.jsonl_process import LOG_TAIL_CHARS, JsonLinesProcess

from ..inputs import model as model_loader
from ..inputs import observations
from . import reference
from ..run import rollouts
from ..judge.metrics import latency_stats
from ..outdir import write_atomic_with
from ..run.protocol import DONE, OUTPUTS_FILE, Measurement, stage_message
from ..results import CellError
from .source_fit import DIVIDE_255, NORMALIZE, divide_255_key
from .source_runner import normalized

RUNNER = Path(__file__).with_name("source_runner.py")
FACTS_FILE = "source.json"
ANSWERS_FILE = "source_answers.npz"


class SourceJob:
    def __init__(self, folder: Path, source: dict):
        self.folder, self.source = folder, source
        self.spec = json.loads((folder / "source_spec.json").read_text())
        self.measurement = Measurement(worker_pid=os.getpid())
        self.arrays: dict[str, np.ndarray] = {}
        self.names = self.spec["outputs"]

    def enter(self, name: str, progress: str = "") -> None:
        self.measurement.stage = name
        self.save()
        print(stage_message(name, progress), flush=True)

    def save(self) -> None:
        write_atomic_with(self.folder / OUTPUTS_FILE, lambda stream: np.savez(stream, **self.arrays))
        self.measurement.save(self.folder)

    def named(self, answers: list) -> dict[str, np.ndarray]:
        """The source's answers by output name: all outputs in order when it gave as many, else its
        first answer is the action (SB3's predict returns the action alone)."""
        if len(answers) == len(self.names):
            return {name: np.asarray(a) for name, a in zip(self.names, answers)}
        return {self.spec["action_output"]: np.asarray(answers[0])}

    def run(self, runner: JsonLinesProcess) -> None:
        self.enter("open")
        facts = runner.call("load", spec={**self.source, "inputs": list(self.spec["batch_axes"])})  # a normaliser's: not side inputs
        (self.folder / FACTS_FILE).write_text(json.dumps(facts))
        self.measurement.runtime_version = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in facts["versions"].items())
        not_taken = self._not_taken(facts.get("observation_space"))
        if not_taken:
            self.measurement.skip = not_taken
            self.measurement.stage = DONE
            return
        self.enter("parity")
        self._parity(runner)
        self._transformed_references(facts.get("normalizer"))
        if self.spec.get("rollout"):
            plan = rollouts.RolloutPlan.from_dict(self.spec["rollout"])
            self.enter("rollout")
            measured, arrays = rollouts.drive(self._step(runner), plan, lambda progress: self.enter("rollout", progress))
            self.measurement.rollout = measured
            self.arrays.update(arrays)
        self.enter("latency")
        timed = runner.call("time", observations=self.spec["observations"], inputs=self.spec["obs_inputs"],
                            batch_axes=self.spec["batch_axes"], warmup=self.spec["warmup"], iters=self.spec["iters"])
        self.measurement.latency = [latency_stats(1, timed["samples_ns"])]
        self.measurement.stage = DONE

    def _not_taken(self, takes: dict | None) -> str:
        """Why the column cannot compare when the export takes inputs the training policy does not ('' when it can):
        the export's answers depend on what those are fed, and the policy never sees them (SB3's Box policy beside a
        `deterministic` or `rng` input). The column's statement, not a FAIL of the export."""
        names = self.spec["obs_inputs"]
        if takes is None or (len(names) == 1 and "shape" in takes):
            return ""
        if "keys" in takes:
            taken, what = [name for name in names if name in takes["keys"]], f"the Dict observation's keys {takes['keys']}"
        else:
            taken = [name for name, shape in _row_shapes(Path(self.spec["model"]), Path(self.spec["observations"])).items()
                     if shape == list(takes["shape"])][:1]
            what = f"its observation alone ({', '.join(taken) or 'none of the inputs'}, a Box of shape {takes['shape']})"
        others = [name for name in names if name not in taken]
        if not others:
            return ""
        # A value the user gave such an input (--side-input, a --trajectory's) is said: it was fed, to the export alone.
        given = {name: np.asarray(value) for name, value in self.spec["side_inputs"].items() if name in others}
        fed = (f"the value given ({observations.given_words(given)}) goes to the export alone and its answers depend on it"
               if given else f"its answers depend on what {'that is' if len(others) == 1 else 'those are'} fed")
        return (f"not compared: SB3's policy takes {what}; the export also takes {', '.join(others)}, which the "
                f"training policy does not: {fed}, so export parity cannot be measured here")

    def _parity(self, runner: JsonLinesProcess) -> None:
        answers_file = self.folder / ANSWERS_FILE
        answered = runner.call("predict_file", observations=self.spec["observations"], inputs=self.spec["obs_inputs"],
                               batch_axes=self.spec["batch_axes"], out=str(answers_file))
        with np.load(answers_file, allow_pickle=False) as data:  # written by the user's interpreter: never unpickled
            answers = [data[f"answer/{i}"] for i in range(answered["answers"])]
        self.arrays.update({f"outputs/{name}": value for name, value in self.named(answers).items()})

    def _transformed_references(self, normalizer: dict | None) -> None:
        """The float64 reference on the observations as the source's preprocessing would see them: normalised with
        its statistics, and divided by 255: all float inputs, and each alone when there are several (SB3 divides
        a Dict observation's image keys only). An integer input cannot take scaled values: the graph must convert."""
        info = model_loader.load(Path(self.spec["model"]))
        feeds = observations.read(Path(self.spec["observations"]))
        floats = [name for name in self.spec["obs_inputs"] if feeds[name].dtype.kind == "f"]
        seen = {}
        if floats:
            seen[DIVIDE_255] = {**feeds, **{name: divided_by_255(feeds[name]) for name in floats}}
        if len(floats) > 1:
            seen.update({divide_255_key(name): {**feeds, name: divided_by_255(feeds[name])} for name in floats})
        if normalizer and set(normalizer["inputs"]) <= set(floats):
            seen[NORMALIZE] = normalized(feeds, normalizer)
        for transform, values in seen.items():
            outputs = reference.compute(info, values, self.spec["chunk"]).outputs
            self.arrays.update({f"transform/{transform}/{name}": value for name, value in outputs.items()})

    def _step(self, runner: JsonLinesProcess) -> rollouts.Step:
        names = self.spec["obs_inputs"]

        def step(feeds: observations.Feeds) -> observations.Feeds:
            given = {name: feeds[name] for name in names}
            return self.named(runner.call("predict", obs={name: obs.tolist() for name, obs in given.items()},
                                          dtypes={name: str(obs.dtype) for name, obs in given.items()}))

        return step


def _row_shapes(model_path: Path, observations_path: Path) -> dict[str, list[int]]:
    """Each input's shape for one observation: its array in the set without its batch axis (whole without one)."""
    axes = model_loader.load(model_path).batch_axes
    return {name: [n for axis, n in enumerate(array.shape) if axis != axes.get(name)]
            for name, array in observations.read(observations_path).items()}


def divided_by_255(obs: np.ndarray) -> np.ndarray:
    return obs / np.array(255, obs.dtype)


def check(runner: JsonLinesProcess, source: dict) -> dict:
    """The runner's answer to `check` (it imports the framework and the user's module), or its last words when it
    ended without one (an interpreter without numpy)."""
    try:
        return {"answer": {"ok": True, "result": runner.call("check", spec=source)}}
    except RuntimeError as error:
        if runner.process.poll() is None:  # it answered with an error and waits for the next request
            return {"answer": {"ok": False, "error": str(error)}}
        return {"answer": None, "stderr": runner.log()[-LOG_TAIL_CHARS:]}


def run_column(runner: JsonLinesProcess, folder: Path, source: dict) -> None:
    job = SourceJob(folder, source)
    try:
        job.run(runner)
    except Exception as error:  # the user's code's (or its interpreter's) own words become the cell's reason
        text = " ".join(str(error).split())[:600]
        if not isinstance(error, RuntimeError):  # a runner's answer carries its own type name already
            text = f"{type(error).__name__}: {text}" if text else type(error).__name__
        job.measurement.error = CellError(stage=job.measurement.stage, message=text)
        traceback.print_exc(limit=8)
    finally:
        job.save()


def main() -> None:
    request = json.loads(sys.stdin.readline())
    try:
        runner = JsonLinesProcess([request["python"], str(RUNNER)], "the source's interpreter")
    except OSError as error:
        print(json.dumps({"check": {"start_error": error.strerror or str(error)}}), flush=True)
        return
    try:
        if request["check"]:
            print(json.dumps({"check": check(runner, request["source"])}), flush=True)
        column = sys.stdin.readline()  # idle until the run reaches its column
        if column:
            run_column(runner, Path(json.loads(column)["folder"]), request["source"])
    finally:
        runner.close()


if __name__ == "__main__":
    main()
