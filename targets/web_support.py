"""What the browser and node targets share: the harness files, a local server,
tensors as bytes, and ORT's placement log lines turned into rows.

onnxruntime-web and onnxruntime-node are npm packages installed by
`policy-matrix setup web` (which `make setup` runs) into web_harness/node_modules
of a source checkout, or into a per-user copy of the harness for an installed
package; nothing is fetched from a CDN.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import shutil
import threading
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from . import paths
from .base import Feeds, PlacementRow
from .build_once import build_once
from .versions import NODE_MODULES_ENV

# The harness as shipped: beside targets/ in a checkout and in an installed wheel alike.
PACKAGED_HARNESS = Path(__file__).resolve().parent.parent / "web_harness"
# What npm and the runners need; node_modules/ is made by `policy-matrix setup web`.
HARNESS_FILES = ("package.json", "package-lock.json", "requirements.txt", "page", "node")


def harness_digest() -> str:
    """Content hash of the shipped harness: a per-user copy is keyed by it, so an upgrade gets a fresh one."""
    digest = hashlib.sha256()
    for name in HARNESS_FILES:
        root = PACKAGED_HARNESS / name
        for path in sorted([root] if root.is_file() else p for p in root.rglob("*") if p.is_file()):
            digest.update(path.relative_to(PACKAGED_HARNESS).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def install_dir() -> Path:
    """Where `policy-matrix setup web` runs npm: in place in a writable source checkout, else a per-user copy.

    An installed wheel's files belong to pip (node_modules written among them would
    outlive `pip uninstall`), and a system-wide install is not writable at all.
    """
    checkout = (PACKAGED_HARNESS.parent / "pyproject.toml").exists()
    if checkout and os.access(PACKAGED_HARNESS, os.W_OK):
        return PACKAGED_HARNESS
    return paths.cache_dir() / "web-harness" / harness_digest()


def harness_dir() -> Path:
    """The harness the targets use: the set-up one, else the shipped one (whose targets then say what to run)."""
    installed = install_dir()
    return installed if (installed / "node_modules").is_dir() else PACKAGED_HARNESS


HARNESS_DIR = harness_dir()
# A worker of a pinned target (`ort-web-wasm@1.22.0`, targets/versions.py) is started with that
# release's own node_modules; every other process uses the harness's.
NODE_MODULES = Path(os.environ.get(NODE_MODULES_ENV) or HARNESS_DIR / "node_modules")
ORT_WEB_DIST = NODE_MODULES / "onnxruntime-web" / "dist"
SETUP_HINT = "run `policy-matrix setup web` (npm ci of the harness's pinned packages)"


def npm_package_version(package: str) -> str | None:
    manifest = NODE_MODULES / package / "package.json"
    if not manifest.exists():
        return None
    return json.loads(manifest.read_text())["version"]


def missing_npm_package(package: str) -> str | None:
    if npm_package_version(package) is None:
        return f"npm package {package} is not installed: {SETUP_HINT}"
    return None


@functools.cache
def node_executable() -> str | None:
    return shutil.which("node")


# --- tensors as bytes -------------------------------------------------------


def encode_feeds(feeds: Feeds) -> dict:
    wire = {}
    for name, value in feeds.items():
        array = np.asarray(value, order="C")  # ascontiguousarray would make a scalar input 1-d
        dtype = "bool" if array.dtype == np.bool_ else array.dtype.name
        wire[name] = {"dtype": dtype, "shape": list(array.shape), "b64": base64.b64encode(array.tobytes()).decode()}
    return wire


def decode_outputs(wire: dict) -> Feeds:
    outputs = {}
    for name, tensor in wire.items():
        dtype = np.bool_ if tensor["dtype"] == "bool" else np.dtype(tensor["dtype"])
        data = np.frombuffer(base64.b64decode(tensor["b64"]), dtype=dtype)
        outputs[name] = data.reshape(tensor["shape"]).copy()
    return outputs


# --- placement from ORT's verbose log ---------------------------------------

# "Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2" then " Cast (name)" lines,
# or "All nodes placed on [JsExecutionProvider]. Number of nodes: 5". Each is matched from the start of ORT's
# message: a node line (a name ORT prints verbatim) that holds such words is a node line still.
_PLACED = re.compile(r"\s*(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_NODE = re.compile(r"^\s*(\w+) \((.*)\)\s*$")
# "2026-11-30 05:43:05.445 [V:onnxruntime:, session_state.cc:1385 Verify...] message"
_PREFIX = re.compile(r"^.*?\[[VIWEF]:onnxruntime:[^\]]*\] ?")
_KEPT = re.compile("\x00(\\d+)\x00")  # a node name with a line break, kept whole while the log is split


def _log_lines(log: list[str], nodes: list[tuple[str, str]]) -> tuple[list[str], Callable[[str], str]]:
    """Every physical line once, in order (ORT prints some messages twice), and how to put back the names kept
    whole: a node name with a line break in it (the model's to choose) would otherwise read as lines of ORT's own,
    forging a placement. Each such name of the model is a placeholder until the lines are read."""
    broken = sorted({name for _, name in nodes if name.splitlines() != [name]}, key=len, reverse=True)
    text = "\n".join(log)  # whole: the page gets a message from ORT's wasm a physical line at a time
    for index, name in enumerate(broken):
        text = text.replace(name, f"\x00{index}\x00")
    seen, lines = set(), []
    for line in text.splitlines():
        message = _PREFIX.sub("", line, count=1)  # the timestamp differs between repeats
        if message not in seen:
            seen.add(message)
            lines.append(message)
    return lines, lambda text: _KEPT.sub(lambda kept: broken[int(kept.group(1))], text)


def placement_from_log(log: list[str], nodes: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Execution provider -> [(op_type, node name)] as ORT logged its partitioning of the model's `nodes`.

    An EP that received every node is logged without names: its list is empty
    and the caller fills it from the model's nodes.
    """
    lines, named = _log_lines(log, nodes)
    placed: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in lines:
        header = _PLACED.match(line)
        if header:
            current = header.group(2) if header.group(1).startswith("Node") else None
            placed.setdefault(header.group(2), [])
            continue
        node = _NODE.match(line) if current else None
        if node:
            placed[current].append((node.group(1), named(node.group(2))))
        else:
            current = None
    return placed


def placement_rows(model_nodes: list[tuple[str, str]], placed: dict, accelerator: str, label: str) -> list[PlacementRow]:
    """One row per ONNX node of the model; a node ORT listed on another EP is a fallback.

    `accelerator` is ORT's name for the requested EP, `label` what the report shows
    for it. Nodes ORT created itself (fusions, layout transforms) keep their own rows.
    """
    elsewhere = {name: (op, ep) for ep, nodes in placed.items() if ep != accelerator for op, name in nodes}
    rows = [
        PlacementRow(name, op, elsewhere[name][1], True) if name in elsewhere else PlacementRow(name, op, label, False)
        for op, name in model_nodes
    ]
    known = {name for _, name in model_nodes}
    rows += [PlacementRow(name, op, ep, True) for name, (op, ep) in elsewhere.items() if name not in known]
    return rows


def model_nodes(path: Path) -> list[tuple[str, str]]:
    """(op_type, name) of the graph's nodes; unnamed nodes get ORT's positional name."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(node.op_type, node.name or f"{node.op_type}_{index}") for index, node in enumerate(graph.node)]


@functools.cache
def one_node_model() -> str:
    """A one-node ONNX model (y = x + x on a float[1]), base64: what the page opens to start the runtime
    itself (harness.mjs startRuntime) before a cell's cold start is timed. Add runs on every backend."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "start",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return base64.b64encode(model.SerializeToString()).decode()


# --- fixed-batch copies (WebGL has no symbolic batch) ------------------------


def fixed_batch_model(source: Path, batch: int, cache_dir: Path, batch_axes: dict[str, int]) -> Path:
    """A copy of `source` whose inputs and outputs have dimension `batch` on their batch axis (an LSTM
    state's [layers, batch, hidden]: axis 1; inputs without one keep their shape), cached, made once."""
    digest = hashlib.sha256(source.read_bytes() + json.dumps(batch_axes, sort_keys=True).encode()).hexdigest()[:16]
    target = cache_dir / "fixed-batch" / f"{digest}-b{batch}-v3.onnx"  # bump the tag when the recipe changes

    def write(staging: Path) -> None:
        model = onnx.load(str(source))
        for value in list(model.graph.input) + list(model.graph.output):
            dims = value.type.tensor_type.shape.dim
            axis = batch_axes.get(value.name)
            if axis is not None and axis < len(dims) and not dims[axis].HasField("dim_value"):  # only a symbolic batch
                dims[axis].dim_value = batch
        del model.graph.value_info[:]  # stale symbolic shapes; the runtime infers its own
        onnx.save(model, str(staging))

    build_once(target, write)
    return target


# --- the local server ---------------------------------------------------------

_CONTENT_TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
                  ".html": "text/html", ".onnx": "application/octet-stream", ".json": "application/json"}


def _local_host(host: str, port: int) -> bool:
    """Only requests addressed to this server by a loopback name: a page on another origin whose DNS name
    was rebound to 127.0.0.1 sends its own name as Host (DNS rebinding)."""
    return host in (f"127.0.0.1:{port}", f"localhost:{port}")


class HarnessServer:
    """Serves the page, the ORT dist/ files and explicitly published models on 127.0.0.1.

    Cross-origin isolation headers make performance.now() precise and allow wasm
    threads. Models are published under opaque tokens, never under names taken
    from the model.
    """

    def __init__(self):
        self.models: dict[str, Path] = {}
        roots = {"/harness/": HARNESS_DIR / "page", "/ort/": ORT_WEB_DIST}
        server_self = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server naming)
                self._answer(with_body=True)

            def do_HEAD(self):  # noqa: N802 — the base class's HEAD would serve any file, outside the roots too
                self._answer(with_body=False)

            def _answer(self, with_body: bool) -> None:
                if not _local_host(self.headers.get("Host", ""), self.server.server_address[1]):
                    self.send_error(HTTPStatus.MISDIRECTED_REQUEST)  # a rebound DNS name reaching 127.0.0.1
                    return
                path = server_self.resolve(self.path.split("?", 1)[0], roots)
                if path is None:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                body = path.read_bytes()
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", _CONTENT_TYPES.get(path.suffix, "application/octet-stream"))
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cross-Origin-Opener-Policy", "same-origin")
                self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
                self.send_header("Cross-Origin-Resource-Policy", "same-origin")
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, *args):  # keep the run's output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def publish(self, path: Path) -> str:
        token = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        self.models[token] = path
        return f"{self.origin}/models/{token}.onnx"

    def resolve(self, url_path: str, roots: dict[str, Path]) -> Path | None:
        if url_path.startswith("/models/"):
            return self.models.get(url_path.removeprefix("/models/").removesuffix(".onnx"))
        for prefix, root in roots.items():
            if url_path.startswith(prefix):
                candidate = (root / url_path.removeprefix(prefix)).resolve()
                if candidate.is_file() and candidate.is_relative_to(root.resolve()):
                    return candidate
        return None

    def stop(self) -> None:
        """Stop serving without waiting: shutdown() returns only once serve_forever's 0.5 s poll has noticed,
        which cost each page that closed (a web worker moving on to the next target) that long."""
        threading.Thread(target=self._close, daemon=True).start()

    def _close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
