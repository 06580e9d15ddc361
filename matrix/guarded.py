"""The tool's own steps on the user's model, each in a guarded process: `python -m matrix.guarded STEP DIR`.

Outside the cells the tool evaluates the user's graph too: checking a variant loads it in
ONNX Runtime (which folds constants while it loads), onnxsim runs the model to verify its
folding, a diagnosis evaluates every intermediate in float64. Each such step gets a cell's
protection (matrix.isolation: --timeout, the memory cap, death with the runner), so a
hostile model ends that step's process, never the runner. A step reads DIR/step_spec.json
and answers plain JSON in DIR/step_result.json; arrays travel as .npz files, never pickles.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from . import cells

# step -> "module:function(spec: dict, folder: Path) -> dict"; imported in the child only
STEPS = {
    "variants": "matrix.variants:guarded_step",
    "preparations": "matrix.preparations:guarded_step",
    "intermediates": "matrix.diagnose:guarded_step",
    "env-check": "matrix.env_check:guarded_step",
}


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    memory_limit: int | None


class StepFailed(RuntimeError):
    """The step's process ended without an answer; the message says how (timeout, memory, its error)."""


def run(step: str, spec: dict, folder: Path, limits: Limits) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    answer = folder / "step_result.json"
    answer.unlink(missing_ok=True)
    (folder / "step_spec.json").write_text(json.dumps(spec))
    ending = cells.run_guarded([sys.executable, "-m", "matrix.guarded", step, str(folder)], folder / "step.log",
                               dict(os.environ), limits.timeout_s, limits.memory_limit, lambda stage: None)
    try:
        return json.loads(answer.read_text())
    except (OSError, ValueError):
        raise StepFailed(ending.describe()) from None


def _main(step: str, folder: Path) -> None:
    module, function = STEPS[step].split(":")
    answer = getattr(importlib.import_module(module), function)(json.loads((folder / "step_spec.json").read_text()), folder)
    partial = folder / ".step_result.json.partial"
    partial.write_text(json.dumps(answer))
    partial.replace(folder / "step_result.json")


if __name__ == "__main__":
    _main(sys.argv[1], Path(sys.argv[2]))
