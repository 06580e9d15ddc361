"""Convert one ONNX policy to .tflite files with onnx2tf (runs inside the onnx2tf environment).

Called as `python tflite_convert.py request.json` by targets/tflite.py through
targets.isolated_env.run_json: files in, one JSON line out. This file imports
nothing from the project, because the core's packages are not installed here.

Request: {"onnx", "workdir", "out_dir", "quantize": "dynamic" | "full",
          "keep_nchw": [input names], "calibration": {input name: .npy path}}
Answer:  {"ok": true, "files": {"fp32"|"fp16"|"int8"|"int8-full": path},
          "errors": {variant: why its file is missing},
          "seconds": float, "converter": str, "layers": {ONNX node: [Keras layer names]}}
Each file stands on its own: the int8 post-step failing (no SavedModel to
quantize from) leaves the float32/float16 files onnx2tf already wrote.
      or {"ok": false, "error": onnx2tf's own words}

onnx2tf prints progress on stdout and TensorFlow logs on stderr; both go to a
log file so the only line on stdout is the answer, and the last error lines
of that log become the message of a failed conversion.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import re
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# onnx2tf's file suffix -> the name this project gives that precision.
OUTPUTS = {
    "float32": "fp32",
    "float16": "fp16",
    "integer_quant": "int8-full",  # int8 weights and activations, float I/O, calibrated
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# TensorFlow wraps an error raised while it traces onnx2tf's Keras model in its own frames: "in user code:", then
# `File "...", line N, in ...` lines, then the error itself, then every layer's call arguments.
TRACED = "in user code:"
FRAME = re.compile(r'File "[^"]*", line \d+, in ')
INNER_ERROR = re.compile(r"\b\w+(?:Error|Exception): ")
CALL_ARGUMENTS = "Call arguments received"


@contextlib.contextmanager
def output_to(log_path: Path):
    """Send file descriptors 1 and 2 (Python and native code alike) to a log file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


class LayerTrace:
    """Which Keras layers onnx2tf built for each ONNX node.

    onnx2tf turns every ONNX node into TF ops on Keras tensors; the .tflite
    tensor names keep those layer names ("model/tf.nn.relu/Relu;..."), so this
    record is what ties a TFLite op back to the ONNX nodes it came from.
    Each op module's make_node is wrapped; after it runs, the layers between
    the node's outputs and the tensors that already existed are its own.
    """

    def __init__(self):
        self.layers: dict[str, list[str]] = {}
        self._known: set[int] = set()

    def install(self) -> None:
        import onnx2tf.ops

        for info in pkgutil.iter_modules(onnx2tf.ops.__path__):
            module = importlib.import_module(f"onnx2tf.ops.{info.name}")
            if hasattr(module, "make_node"):
                module.make_node = self._wrap(module.make_node)

    def _wrap(self, make_node):
        def traced(*args, **kwargs):
            result = make_node(*args, **kwargs)
            node = kwargs.get("graph_node")
            tensors = kwargs.get("tf_layers_dict")
            if node is not None and tensors is not None:  # the Input op has no graph_node
                self._record(node, tensors)
            return result

        return traced

    def _record(self, node, tensors: dict) -> None:
        for name in [t.name for t in node.inputs]:
            self._known.add(id(tensors.get(name, {}).get("tf_node")))
        seen: set[str] = set()
        outputs = [tensors.get(t.name, {}).get("tf_node") for t in node.outputs]
        self.layers[node.name] = [layer for out in outputs for layer in self._behind(out, seen)]
        self._known.update(id(out) for out in outputs)

    def _behind(self, tensor, seen: set[str]) -> list[str]:
        history = getattr(tensor, "_keras_history", None)
        if history is None or id(tensor) in self._known or history.layer.name in seen:
            return []
        seen.add(history.layer.name)
        inbound = history.layer.inbound_nodes[history.node_index].keras_inputs
        return [history.layer.name] + [name for t in inbound for name in self._behind(t, seen)]


# onnx2tf's sample images (20 MS-COCO crops, 128x128 RGB, values in [0, 1]): the shape and range it expects.
SAMPLE_IMAGES = (20, 128, 128, 3)


def offline() -> None:
    """Converters run with network access disabled, on purpose. onnx2tf downloads sample images as dummy
    inputs for its own check of 4D three-channel inputs (it uses ones where it has none); without a network
    that download's ConnectionError hid the conversion's real error (a ConvTranspose policy: an IndexError),
    and with one the conversion depended on a remote file. It gets seeded images of the same shape and range
    instead, and no socket of this process can connect."""
    import socket

    import numpy as np

    entry, common_functions = (importlib.import_module(name) for name in ("onnx2tf.onnx2tf", "onnx2tf.utils.common_functions"))

    def sample_images() -> np.ndarray:
        return np.random.default_rng(0).random(SAMPLE_IMAGES, dtype=np.float32)

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError("network access is disabled for converters (policy-matrix)")

    entry.download_test_image_data = common_functions.download_test_image_data = sample_images
    socket.socket.connect = socket.socket.connect_ex = refuse
    socket.create_connection = refuse


def convert(request: dict, trace: LayerTrace) -> tuple[dict, dict]:
    import numpy as np
    import onnx2tf

    offline()

    out_dir = Path(request["out_dir"])
    calibration = None
    if request["quantize"] == "full":
        # [input name, .npy path, mean, std]: onnx2tf feeds (x - mean) / std to the calibrator.
        calibration = [[name, path, np.float32(0.0), np.float32(1.0)] for name, path in request["calibration"].items()]
    trace.install()
    onnx2tf.convert(
        input_onnx_file_path=request["onnx"],
        output_folder_path=str(out_dir),
        keep_ncw_or_nchw_or_ncdhw_input_names=request["keep_nchw"] or None,
        output_integer_quantized_tflite=request["quantize"] == "full",
        custom_input_op_name_np_data_path=calibration,
        non_verbose=True,
    )
    stem = Path(request["onnx"]).stem
    files = {
        name: str(out_dir / f"{stem}_{suffix}.tflite")
        for suffix, name in OUTPUTS.items()
        if (out_dir / f"{stem}_{suffix}.tflite").exists()
    }
    errors = {}
    if request["quantize"] == "dynamic":
        try:
            files["int8"] = dynamic_range_quantize(out_dir, out_dir / f"{stem}_dynamic_range_quant.tflite")
        except Exception as exc:  # the float files are already written and stand on their own
            traceback.print_exc()
            errors["int8"] = "dynamic-range int8 from onnx2tf's SavedModel failed: " + ANSI.sub("", f"{type(exc).__name__}: {exc}").strip()
    if request["quantize"] == "full" and "int8-full" not in files:
        raise RuntimeError("onnx2tf wrote no integer-quantized model (see its INT8 quantization warning)")
    return files, errors


def dynamic_range_quantize(saved_model: Path, target: Path) -> str:
    """int8 weights, float activations: the converter onnx2tf's -odrqt uses, but from the
    SavedModel so the file keeps its signature (onnx2tf's own file has none, and renames
    inputs and outputs to "obs"/"Identity")."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    target.write_bytes(converter.convert())
    return str(target)


def converter_version() -> str:
    from importlib.metadata import version

    return f"onnx2tf {version('onnx2tf')}, tensorflow {version('tensorflow')}"


def error_from_log(log_text: str, exception: BaseException) -> str:
    """The converter's own words: its exception, or the ERROR lines it printed before sys.exit."""
    if isinstance(exception, ModuleNotFoundError) and (exception.name or "").startswith("onnx2tf.ops."):
        return f"{exception.name.rsplit('.', 1)[1]} OP is not yet implemented in onnx2tf ({exception})"
    if not isinstance(exception, SystemExit):
        return ANSI.sub("", traced_error(str(exception)) or f"{type(exception).__name__}: {exception}").strip()
    lines = [ANSI.sub("", line).strip() for line in log_text.splitlines()]
    errors = [line for line in lines if line.startswith("ERROR:") or "error:" in line.lower()]
    if errors:
        return " | ".join(dict.fromkeys(errors[-3:]))
    return next((line for line in reversed(lines) if line), f"onnx2tf exited with {exception.code}")


def traced_error(message: str) -> str:
    """The error inside TensorFlow's "in user code:" frames, without them and the call arguments after it ("" when
    the message has no such frames): the cell's reason began with onnx2tf's and tf_keras's file paths and line
    numbers, and the converter's own words came after 300 characters of them."""
    frames = list(FRAME.finditer(message)) if TRACED in message else []
    inner = INNER_ERROR.search(message, frames[-1].end()) if frames else None
    return message[inner.start():].split(CALL_ARGUMENTS, 1)[0].strip() if inner else ""


def main(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    log_path = Path(request["workdir"]) / "onnx2tf.log"
    start = time.perf_counter()
    failure: BaseException | None = None
    files: dict[str, str] = {}
    errors: dict[str, str] = {}
    trace = LayerTrace()
    with output_to(log_path):
        try:
            files, errors = convert(request, trace)
        except BaseException as exc:  # onnx2tf calls sys.exit(1) on unsupported input
            failure = exc
            traceback.print_exc()
    seconds = time.perf_counter() - start
    if failure is not None:
        answer = {"ok": False, "error": error_from_log(log_path.read_text(errors="replace"), failure)}
    else:
        answer = {
            "ok": True, "files": files, "errors": errors, "seconds": seconds, "converter": converter_version(), "layers": trace.layers,
            "log": str(log_path),
        }
    print(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1])
