"""Core ML prediction server, run inside the CoreML environment on macOS.

`python coreml_predict.py` reads one JSON request per line on stdin and answers
one JSON line each, {"ok": true, "result": ...} or {"ok": false, "error": ...}
(the protocol of targets/jsonl_process.py); arrays travel as .npz files. Requests:
  {"op": "load", "path": ..., "compute_units": "CPU_AND_NE", "inputs": {...}, "outputs": {...}}
  {"op": "run", "feeds": in.npz, "out": out.npz}
  {"op": "time", "feeds": in.npz, "warmup": n, "iters": n}   -> per-call ns, timed here
  {"op": "placement"}                                         -> MLComputePlan per MIL op
It first answers {"ready": true} once coremltools is imported, and exits at the end of its input. It lives in the environment that converted the model because coremltools does
(prediction needs its native extension, which exists on macOS only). Written
against coremltools' documented API: MLModel(compute_units=...), predict,
get_compiled_model_path, MLComputePlan.load_from_path, MLComputeDevice.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import numpy as np

# Run as a script, its own folder is on sys.path: the targets' timing loop (standard library only)
# and the MIL walk of the converter, which runs in this same environment.
from coreml_convert import mil_operations
from timing import time_calls


class Server:
    def __init__(self):
        self.model = None

    def load(self, request: dict) -> dict:
        import coremltools as ct

        self.units = getattr(ct.ComputeUnit, request["compute_units"])
        self.inputs, self.outputs = request["inputs"], request["outputs"]
        started = time.perf_counter_ns()
        self.model = ct.models.MLModel(request["path"], compute_units=self.units)
        return {"load_ms": (time.perf_counter_ns() - started) / 1e6, "compute_unit": self.model.compute_unit.name,
                "devices": _available_devices()}

    def _coreml_feeds(self, path: str) -> dict:
        arrays = np.load(path)
        # CoreML has no 64-bit tensors: the converted inputs are float32 / int32.
        return {coreml: _narrow(arrays[name]) for name, coreml in self.inputs.items()}

    def run(self, request: dict) -> dict:
        predicted = self.model.predict(self._coreml_feeds(request["feeds"]))
        outputs = {name: np.asarray(predicted[spec["coreml"]]).astype(spec["dtype"]) for name, spec in self.outputs.items()}
        np.savez(request["out"], **outputs)
        return {}

    def time(self, request: dict) -> dict:
        feeds, predict = self._coreml_feeds(request["feeds"]), self.model.predict
        return {"samples": time_calls(functools.partial(predict, feeds), request["warmup"], request["iters"])}

    def placement(self, _request: dict) -> dict:
        from coremltools.models.compute_plan import MLComputePlan

        plan = MLComputePlan.load_from_path(path=self.model.get_compiled_model_path(), compute_units=self.units)
        rows = []
        for operation in mil_operations(plan.model_structure.program.functions["main"].block):
            if operation.operator_name == "const":
                continue
            usage = plan.get_compute_device_usage_for_mlprogram_operation(operation)
            rows.append({
                "operator": operation.operator_name,
                "outputs": [output.name for output in operation.outputs],
                "preferred": _device_name(usage.preferred_compute_device) if usage else None,
                "supported": [_device_name(device) for device in usage.supported_compute_devices] if usage else [],
            })
        return {"rows": rows}


def _narrow(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.float64:
        return array.astype(np.float32)
    if array.dtype == np.int64:
        return array.astype(np.int32)
    return array


def _device_name(device) -> str:
    from coremltools.models.compute_device import MLCPUComputeDevice, MLGPUComputeDevice, MLNeuralEngineComputeDevice

    for kind, name in ((MLNeuralEngineComputeDevice, "ANE"), (MLGPUComputeDevice, "GPU"), (MLCPUComputeDevice, "CPU")):
        if isinstance(device, kind):
            return name
    return type(device).__name__


def _available_devices() -> list[str] | None:
    """Devices Core ML can use on this Mac (None where the API is missing: macOS < 14)."""
    try:
        from coremltools.models.compute_device import MLComputeDevice

        return sorted({_device_name(device) for device in MLComputeDevice.get_all_compute_devices()})
    except Exception:
        return None


def main() -> None:
    # Answers go to a private copy of stdout; anything a library prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import coremltools  # noqa: F401  (the slow import happens before "ready")

    server = Server()
    answer({"ok": True, "result": {"ready": True}}, answers)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer({"ok": True, "result": getattr(server, request["op"])(request)}, answers)
        except Exception as error:  # the runtime's own words, back to the cell
            answer({"ok": False, "error": f"{type(error).__name__}: {' '.join(str(error).split())}"}, answers)


def answer(reply: dict, answers) -> None:
    answers.write(json.dumps(reply) + "\n")
    answers.flush()


if __name__ == "__main__":
    main()
