"""onnxruntime-node: the policy as a Node.js service would run it (CPU EP).

Each session is one `node web_harness/node/runner.mjs` process, spoken to with
one JSON line per request; tensors travel as base64 bytes and latency is taken
inside node with process.hrtime. ORT's verbose log (stderr) gives placement.
"""

from __future__ import annotations

import functools
import subprocess

from .base import NO_SETTINGS, Artifact, BackendInfo, Feeds, PlacementRow, Session, Settings, Target, UNREAD
from .jsonl_process import JsonLinesProcess
from .versions import NpmRelease
from .web_support import (
    HARNESS_DIR,
    decode_outputs,
    encode_feeds,
    missing_npm_package,
    model_nodes,
    node_executable,
    npm_package_version,
    placement_from_log,
    placement_rows,
)

RUNNER = HARNESS_DIR / "node" / "runner.mjs"
NODE_FLOOR = "1.17.0"  # pinned releases (`ort-node@1.20.1`): the oldest tried, and it runs the harness (measured)


@functools.cache
def node_version() -> str:
    node = node_executable()
    return subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip() if node else ""


class NodeSession(Session):
    def __init__(self, artifact: Artifact, threads: int, backend: str, ort_ep: str):
        self.artifact, self.backend_name, self.ort_ep = artifact, backend, ort_ep
        self.runner = JsonLinesProcess([node_executable(), str(RUNNER)], "node")
        try:
            self.opened = self.runner.call("open", model=str(artifact.path), threads=threads, backend=backend)
            self.log = self.runner.log().splitlines()  # ORT's verbose session log: placement
        except BaseException:
            self.close()
            raise

    def run(self, feeds: Feeds) -> Feeds:
        return decode_outputs(self.runner.call("run", feeds=encode_feeds(feeds)))

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        return self.runner.call("time", feeds=encode_feeds(feeds), warmup=warmup, iters=iters)

    def placement(self) -> list[PlacementRow]:
        nodes = model_nodes(self.artifact.path)
        return placement_rows(nodes, placement_from_log(self.log, nodes), self.ort_ep, self.ort_ep)

    def backend(self) -> BackendInfo:
        placed = placement_from_log(self.log, model_nodes(self.artifact.path))
        actual = self.backend_name if self.ort_ep in placed else ", ".join(placed) or UNREAD
        loaded = self.opened["versions"]  # as the runtime reports itself: a pinned release shows here
        unread = "ORT logged no node placement; " if actual == UNREAD else ""
        return BackendInfo(self.backend_name, actual,
                           detail=f"{unread}onnxruntime-node {loaded.get('node', '?')}, node {loaded.get('nodejs', '')}")

    def close(self) -> None:
        self.runner.close()


class OrtNode(Target):
    runs_onnx_as_is = True
    name = "ort-node"
    summary = "onnxruntime-node (Node.js), CPU execution provider"
    backend = "cpu"
    ort_ep = "CPUExecutionProvider"
    release = NpmRelease("onnxruntime-node", floor=NODE_FLOOR,
                         why_floor="the oldest release tried with the runner (1.17.0 runs it)")

    def runtime_version(self) -> str:
        return f"onnxruntime-node {npm_package_version('onnxruntime-node') or '(not installed)'}, node {node_version() or '(missing)'}"

    def unavailable_reason(self) -> str | None:
        if node_executable() is None:
            return "Node.js is not installed (needs node >= 18 on PATH; Debian: apt-get install nodejs)"
        return missing_npm_package("onnxruntime-node")

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        return NodeSession(artifact, threads, self.backend, self.ort_ep)
