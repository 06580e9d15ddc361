"""The least a single-runtime check costs when every job touching the model is its own process.

No policy-matrix code runs here: this is the chain the design requires, written as plainly as it can be, so
bench/polygraphy_pair.py can say how much of a check's start-up is the design's and how much is ours.

- the runner starts a pre-warmed server first (numpy, onnx and onnx.reference imported before the reference
  job is forked, onnxruntime while it runs), then imports numpy and onnx itself, reads the model and writes
  seeded observations;
- the server forks the float64 reference job (onnx.reference on the widened graph), then the cell worker (an
  onnxruntime CPU session, 20 untimed and 200 timed calls at batch 1 and at batch 64, then the whole set);
  each child in its own session, as the tool's jobs are;
- the runner compares, writes results.json and an HTML page through Jinja2.

It is a floor for this shape of processes written plainly, not for every design: it starts the server as a second
interpreter beside the runner (as the tool does); a runner that imported everything and forked its server from
itself, or overlapped the page's Jinja2 import with the jobs, could go lower.

What it leaves out, all of which a check by the tool does: the model's checks (onnx.checker, shape inference,
the limits on what it reads), lints, variants, the contract, the placement profile, percentiles' confidence
intervals, the decision, the report's charts and the progress display.

    python bench/isolation_floor.py MODEL.onnx OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SERVER = r'''
import json, os, sys, time
import numpy as np, onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

def reference(request, feeds):
    model = onnx.load(request["model"])
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    outputs = ReferenceEvaluator(model).run(None, {k: v.astype(np.float64) for k, v in feeds.items()})
    np.savez(request["out"], *outputs)

def cell(request, feeds):
    import onnxruntime

    session = onnxruntime.InferenceSession(request["model"], providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    timed = []
    for batch in (1, 64):
        rows = {name: feeds[name][:batch]}
        for call in range(220):
            started = time.perf_counter()
            session.run(None, rows)
            if call >= 20:
                timed.append(time.perf_counter() - started)
    np.savez(request["out"], *session.run(None, feeds), latency=np.percentile(timed, [50, 90, 99]))

print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        os.setsid()
        with np.load(request["observations"]) as data:
            feeds = {k: data[k] for k in data.files}
        (reference if request["job"] == "reference" else cell)(request, feeds)
        os._exit(0)
    import onnxruntime  # while the reference job runs: the cell's child finds it imported
    os.waitpid(child, 0)
    print("done", flush=True)
'''


def main(model: Path, out: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    import numpy as np  # after the server's start, as the tool's runner does
    import onnx

    graph_input = onnx.load(str(model)).graph.input[0]
    shape = [dim.dim_value or 256 for dim in graph_input.type.tensor_type.shape.dim]
    out.mkdir(parents=True, exist_ok=True)
    observations = out / "observations.npz"
    np.savez(observations, **{graph_input.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)})
    if server.stdout.readline().strip() != "ready":
        sys.exit("the server did not start")
    for job in ("reference", "cell"):
        request = {"job": job, "model": str(model), "observations": str(observations), "out": str(out / f"{job}.npz")}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        if server.stdout.readline().strip() != "done":
            sys.exit(f"the {job} job did not finish")
    with np.load(out / "reference.npz") as reference, np.load(out / "cell.npz") as cell:
        results = {"drift": float(np.max(np.abs(reference["arr_0"] - cell["arr_0"]))), "p50_s": float(cell["latency"][0])}
    (out / "results.json").write_text(json.dumps(results))
    import jinja2

    page = jinja2.Template("<table>{% for key, value in results.items() %}<tr><td>{{ key }}</td><td>{{ value }}</td></tr>"
                           "{% endfor %}</table>").render(results=results)
    (out / "index.html").write_text(page)
    server.stdin.close()
    server.wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
