"""The least a single-runtime check costs when every job touching the model is its own process.

No policy-matrix code runs here: this is the chain the design requires, written as plainly as it can be, so
bench/polygraphy_pair.py can say how much of a check's start-up is the design's and how much is ours.

Every shape does the same work:
- the runner imports numpy and onnx, reads the model and writes seeded observations;
- a float64 reference job (onnx.reference on the widened graph), then a cell worker (an onnxruntime CPU session,
  20 untimed and 200 timed calls at batch 1 and at batch 64, then the whole set), each a forked child in its own
  session with its own memory cap (RLIMIT_DATA, set after the fork), as the tool's jobs are; the worker starts
  once the reference job has ended, so its latency runs alone;
- the runner compares, writes results.json and an HTML page through Jinja2.

The shapes differ in who imports what before which fork (SHAPES):
- server: the tool's shape. A pre-warmed server in a second interpreter, started first (numpy, onnx and
  onnx.reference imported before the reference job is forked, onnxruntime while it runs), forks both jobs; the
  runner imports Jinja2 once both have ended.
- zygote: the runner is its own fork server. It imports numpy, onnx, onnx.reference and onnxruntime, forks the
  reference job, imports Jinja2 while it runs, then forks the worker.
- zygote-ort-overlap: as zygote, but onnxruntime is imported (with Jinja2) while the reference job runs.
- zygote-early-reference: the reference job is forked after numpy and onnx only and imports onnx.reference
  itself, while the runner imports onnxruntime and Jinja2.
- zygote-server: the runner forks a server from itself right after numpy and onnx (no second interpreter); the
  server imports onnx.reference while the runner reads the model, then forks both jobs on request (onnxruntime
  imported while the reference job runs, as the runner imports Jinja2).

What it leaves out, all of which a check by the tool does: the model's checks (onnx.checker, shape inference,
the limits on what it reads), lints, variants, the contract, the placement profile, percentiles' confidence
intervals, the decision, the report's charts and the progress display.

    python bench/isolation_floor.py MODEL.onnx OUT_DIR [SHAPE]     (SHAPE: one of SHAPES, default server)
"""

from __future__ import annotations

import json
import os
import sys

MEMORY_LIMIT = 4 << 30  # each job's RLIMIT_DATA, as the tool's --memory cap
REFERENCE_MODULES = ("onnx.reference", "onnx.reference.ops")


def reference(request: dict, feeds: dict) -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(request["model"])
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    outputs = ReferenceEvaluator(model).run(None, {k: v.astype(np.float64) for k, v in feeds.items()})
    np.savez(request["out"], *outputs)


def cell(request: dict, feeds: dict) -> None:
    import time

    import numpy as np
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


JOBS = {"reference": reference, "cell": cell}


def fork_job(request: dict) -> int:
    """The job's pid: a child of this process in its own session, under its own memory cap."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            import resource

            os.setsid()
            resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))
            import numpy as np

            with np.load(request["observations"]) as data:
                feeds = {k: data[k] for k in data.files}
            JOBS[request["job"]](request, feeds)
            code = 0
        finally:
            os._exit(code)
    return child


def wait_job(child: int, job: str) -> None:
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"the {job} job failed")


def import_all(names) -> None:
    import importlib

    for name in names:
        importlib.import_module(name)


def job_request(job: str, model: str, out: str) -> dict:
    return {"job": job, "model": model, "observations": os.path.join(out, "observations.npz"),
            "out": os.path.join(out, f"{job}.npz")}


def write_observations(model: str, out: str) -> None:
    import numpy as np
    import onnx

    graph_input = onnx.load(model).graph.input[0]
    shape = [dim.dim_value or 256 for dim in graph_input.type.tensor_type.shape.dim]
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, "observations.npz"),
             **{graph_input.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)})


def write_report(out: str) -> None:
    import jinja2
    import numpy as np

    with np.load(os.path.join(out, "reference.npz")) as expected, np.load(os.path.join(out, "cell.npz")) as measured:
        results = {"drift": float(np.max(np.abs(expected["arr_0"] - measured["arr_0"]))),
                   "p50_s": float(measured["latency"][0])}
    with open(os.path.join(out, "results.json"), "w") as file:
        json.dump(results, file)
    page = jinja2.Template("<table>{% for key, value in results.items() %}<tr><td>{{ key }}</td><td>{{ value }}</td></tr>"
                           "{% endfor %}</table>").render(results=results)
    with open(os.path.join(out, "index.html"), "w") as file:
        file.write(page)


# --- a server that forks the jobs, asked over a pipe (server, zygote-server) ----------------------


def serve(requests, replies) -> None:
    """Fork one job per request line; reply `done` when it has ended. onnxruntime is imported while the
    first job runs, so the worker's child finds it imported."""
    replies.write("ready\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        child = fork_job(request)
        import onnxruntime  # noqa: F401
        wait_job(child, request["job"])
        replies.write("done\n")
        replies.flush()


def ask(requests, replies, request: dict) -> None:
    if replies.readline().strip() not in ("ready", "done"):
        sys.exit(f"the server did not start the {request['job']} job")
    requests.write(json.dumps(request) + "\n")
    requests.flush()


def ask_both(requests, replies, model: str, out: str, while_reference=()) -> None:
    ask(requests, replies, job_request("reference", model, out))
    import_all(while_reference)
    ask(requests, replies, job_request("cell", model, out))
    if replies.readline().strip() != "done":
        sys.exit("the cell job did not finish")
    requests.close()


def server_shape(model: str, out: str) -> None:
    import subprocess

    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    write_observations(model, out)  # the runner's numpy and onnx imports, after the server's start as the tool's
    ask_both(server.stdin, server.stdout, model, out)
    server.wait()
    write_report(out)


def zygote_server_shape(model: str, out: str) -> None:
    import_all(("numpy", "onnx"))
    server_reads, runner_writes = os.pipe()
    runner_reads, server_writes = os.pipe()
    server = os.fork()
    if server == 0:
        code = 1
        try:
            os.close(runner_writes)
            os.close(runner_reads)
            import_all(REFERENCE_MODULES)
            serve(os.fdopen(server_reads), os.fdopen(server_writes, "w"))
            code = 0
        finally:
            os._exit(code)
    os.close(server_reads)
    os.close(server_writes)
    write_observations(model, out)
    ask_both(os.fdopen(runner_writes, "w"), os.fdopen(runner_reads), model, out, while_reference=("jinja2",))
    wait_job(server, "server")
    write_report(out)


# --- the runner forks the jobs itself (zygote*) ---------------------------------------------------


def zygote(model: str, out: str, before_reference, while_reference) -> None:
    import_all(("numpy", "onnx", *before_reference))
    write_observations(model, out)
    child = fork_job(job_request("reference", model, out))
    import_all(while_reference)
    wait_job(child, "reference")
    wait_job(fork_job(job_request("cell", model, out)), "cell")
    write_report(out)


SHAPES = {
    "server": server_shape,
    "zygote": lambda model, out: zygote(model, out, (*REFERENCE_MODULES, "onnxruntime"), ("jinja2",)),
    "zygote-ort-overlap": lambda model, out: zygote(model, out, REFERENCE_MODULES, ("onnxruntime", "jinja2")),
    "zygote-early-reference": lambda model, out: zygote(model, out, (), ("onnxruntime", "jinja2")),
    "zygote-server": zygote_server_shape,
}


def main(argv: list[str]) -> None:
    if argv[1:] == ["--serve"]:
        import_all(("numpy", "onnx", *REFERENCE_MODULES))
        serve(sys.stdin, sys.stdout)
        return
    model, out, shape = (*argv[1:], "server")[:3]
    if shape not in SHAPES:
        sys.exit(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    SHAPES[shape](os.path.abspath(model), os.path.abspath(out))


if __name__ == "__main__":
    main(sys.argv)
