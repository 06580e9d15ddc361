"""onnxruntime-web inside headless Chromium: wasm, WebGL and WebGPU backends.

The browser, its pages and the local server are targets/chromium.py's (the three targets' one
worker launches one Chromium over a pipe, a context per target; a browser the user gives is
shared by the three targets through `service_key`). Here: one `WebSession` per
variant on the worker's page (each variant's ORT sessions are released after it), and a
small profile per backend (`OrtWebWasm`, `OrtWebWebgl`, `OrtWebWebgpu`) that names its
bundle and EP and says how its placement and real backend are read. Latency is measured in
the page with performance.now() (cross-origin isolated, so not coarsened); placement
comes from ORT's own verbose log; the backend that really ran is checked, and a software
adapter (SwiftShader) is labelled emulated.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import ClassVar

from .base import EMULATED_ITERS, NO_SETTINGS, Artifact, BackendInfo, Feeds, PlacementRow, Preparation, RunService, Session, Settings, Target, UNREAD
from .chromium import (
    BROWSER_ENDPOINT_ENV,
    UserBrowser,
    chromium_version,
    drop_page,
    shared_page,
    web_unavailable_reason,
)
from .versions import NpmRelease
from .web_support import (
    decode_outputs,
    encode_feeds,
    fixed_batch_model,
    model_nodes,
    npm_package_version,
    one_node_model,
    placement_from_log,
    placement_rows,
)

# Pinned releases (`ort-web-wasm@1.22.0`): 1.19.0 is the first to ship the ES-module bundles the page
# imports (ort.wasm.min.mjs, ort.webgl.min.mjs, ort.min.mjs); 1.17 and 1.18 have none.
WEB_FLOOR = "1.19.0"
_SESSION_KEYS = itertools.count()  # session names unique within a shared page


NOT_LOGGED = "not logged"  # placement when ORT printed none: neither accelerator nor fallback is claimed


class WebSession(Session):
    """onnxruntime-web sessions of one variant in the worker's page: the file as exported, and where the
    backend rejects it (WebGL and symbolic dims), one fixed-batch copy per batch fed, named as a preparation."""

    def __init__(self, target: OrtWebTarget, artifact: Artifact, threads: int):
        self.target, self.artifact, self.threads = target, artifact, threads
        self.page = shared_page(target.bundle)
        self.sessions: dict[int | None, dict] = {}
        self.exported_error = ""  # the backend's own words on the exported file, when a fixed-batch copy ran instead
        try:
            self.probe = self.page.call_once("probe", target.backend)
            if self.probe["present"]:
                try:
                    self._session_for(None)
                except RuntimeError as error:
                    self._rejected(error)
        except BaseException:
            drop_page(target.bundle)  # a page that failed here is not trusted with the next variant
            raise

    def _session_for(self, batch: int | None) -> dict:
        if not self.probe["present"]:
            raise RuntimeError(self.probe["reason"])
        if batch not in self.sessions:
            model = self.artifact.path
            if batch is not None:
                model = fixed_batch_model(model, batch, self.artifact.cache_dir, self.artifact.batch_axes)
            key = f"s{next(_SESSION_KEYS)}-b{batch}"
            url = self.page.server.publish(model)
            opened = self.page.call("open", key, url, self.target.backend, self.threads, True)
            self.sessions[batch] = {"key": key, "log": opened["log"], "model": model}
        return self.sessions[batch]

    def _call(self, function: str, feeds: Feeds, *args):
        encoded = encode_feeds(feeds)
        if not self.exported_error:
            try:
                return self.page.call(function, self._session_for(None)["key"], encoded, *args)
            except RuntimeError as error:
                self._rejected(error)
        try:
            return self.page.call(function, self._session_for(_fed_batch(feeds, self.artifact.batch_axes))["key"], encoded, *args)
        except RuntimeError as error:  # the copy fails too: the exported file's words are the ones that count
            also = "" if " ".join(str(error).split()) == self.exported_error else f" (a fixed-batch copy fails too: {error})"
            raise RuntimeError(f"{self.exported_error}{also}") from None

    def _rejected(self, error: RuntimeError) -> None:
        """The backend rejected the exported file: on a backend with `fixed_batch_copy` the copies run from now
        on and its words are kept for the cell; elsewhere that is the cell's failure."""
        if not self.target.fixed_batch_copy:
            raise error
        self.exported_error = " ".join(str(error).split())[:400]

    def run(self, feeds: Feeds) -> Feeds:
        return decode_outputs(self._call("run", feeds))

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        return self._call("time", feeds, warmup, iters)

    def preparation(self) -> Preparation | None:
        batches = [str(batch) for batch in sorted(b for b in self.sessions if b is not None)]
        if not self.exported_error or not batches:  # the exported file ran, or no copy opened either
            return None
        copies = {f"fixed-batch-{batch}.onnx": self.sessions[int(batch)]["model"] for batch in batches}
        listed = " and ".join([", ".join(batches[:-1]), batches[-1]] if len(batches) > 1 else batches)
        return Preparation(f"a fixed batch of {listed}", self.exported_error, copies)

    def bare_loop_ns(self, feeds: Feeds, iters: int) -> float:
        """Mean ns per call of a bare session.run loop in the same page (for bench/web_overhead.py)."""
        return self._call("bareLoop", feeds, iters)

    def _first_log(self) -> list[str]:
        """The log of the session the cell's numbers came from (the first copy, when the exported file failed)."""
        opened = [self.sessions[b] for b in self.sessions if b is not None or not self.exported_error]
        return opened[0]["log"] if opened else []

    def placement(self) -> list[PlacementRow]:
        """The one source of truth for where nodes ran; the backend check reads these rows too."""
        return self.target.placement_from(model_nodes(self.artifact.path), self._first_log())

    def backend(self) -> BackendInfo:
        rows = self.placement() if self.sessions else []
        info = self.target.verify_backend(self.probe, self._first_log(), bool(self.sessions), rows)
        info.timer_resolution_us = self.page.versions.get("timerStepUs")
        loaded = self.page.versions.get("version", {}).get("web")  # as the page's ORT reports itself
        info.detail = "; ".join(filter(None, [info.detail, f"onnxruntime-web {loaded} in the page" if loaded else ""]))
        if info.emulated:
            info.detail += (f"; emulated: parity only, latency from at most {EMULATED_ITERS} calls at the smallest batch, "
                            "cold start taken beside other work")
        info.detail += self.target.variant_note(self.probe, self.artifact.variant)
        return info

    def close(self) -> None:
        """Release this variant's ORT sessions; the page stays for the next variant of this worker."""
        try:
            for opened in self.sessions.values():
                self.page.call("release", opened["key"])
        except Exception:  # noqa: BLE001 — a page that cannot release is not reused
            drop_page(self.target.bundle)


def _fed_batch(feeds: Feeds, batch_axes: dict[str, int]) -> int:
    """The batch these feeds hold, read on the first input that has a batch axis (1 when none has)."""
    return next((feeds[name].shape[axis] for name, axis in batch_axes.items() if name in feeds), 1)


class OrtWebTarget(Target):
    runs_onnx_as_is = True
    service_key: ClassVar[str] = "chromium"
    worker_group: ClassVar[str] = "browser"  # one worker, Playwright driver and browser for the three, a context each (targets/chromium.py)
    backend: ClassVar[str]  # onnxruntime-web executionProviders name
    bundle: ClassVar[str]  # one ORT bundle per page, from the installed dist/
    ort_ep: ClassVar[str | None]  # ORT's name for the EP in its placement log
    where_label: ClassVar[str]
    fixed_batch_copy: ClassVar[bool] = False  # the backend rejects symbolic dims: run fixed-batch copies, named as such
    release: ClassVar[NpmRelease] = NpmRelease(
        "onnxruntime-web", floor=WEB_FLOOR,
        why_floor="the oldest release with the ES-module bundles the page imports (ort.wasm.min.mjs, ort.webgl.min.mjs)")

    def runtime_version(self) -> str:
        return f"onnxruntime-web {npm_package_version('onnxruntime-web') or '(not installed)'}, {chromium_version()}"

    def unavailable_reason(self) -> str | None:
        return web_unavailable_reason()

    def start_runtime(self, threads: int) -> None:
        """The page, its device probe (a WebGPU adapter request) and ORT's own start in it (its wasm module compiled
        and instantiated with `threads`, the backend's WebGL context or WebGPU device), before and outside the timed
        cold start, as an in-process runtime's import is: cold start is then the session's creation + first
        inference for every variant, where the page's first session used to carry 0.3-5 s of ORT's start alone."""
        if self.unavailable_reason() is None:
            page = shared_page(self.bundle)
            if page.call_once("probe", self.backend)["present"]:
                page.call_once("startRuntime", self.backend, threads, one_node_model())

    def stop_runtime(self) -> None:
        """The target's page and context go (the worker's browser holds the page of the target it serves only);
        the browser stays for the worker's next web target (targets/chromium.py)."""
        drop_page(self.bundle, keep_browser=True)

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        return WebSession(self, artifact, threads)

    def start_service(self, run_dir: Path) -> RunService | None:
        """Only the user's browser is shared by the run; otherwise each worker launches its own (targets/chromium.py)."""
        if endpoint := os.environ.get(BROWSER_ENDPOINT_ENV):
            return UserBrowser(endpoint)
        return None

    def emulated(self) -> bool:
        """Read from the page's device probe (start_runtime has opened the page), as verify_backend reads it."""
        return self.unavailable_reason() is None and self.emulated_on(shared_page(self.bundle).call_once("probe", self.backend))

    def emulated_on(self, probe: dict) -> bool:
        """Whether the device `probe` describes is a software emulation (SwiftShader)."""
        return False

    def verify_backend(self, probe: dict, log: list[str], opened: bool, rows: list[PlacementRow]) -> BackendInfo:
        return BackendInfo(requested=self.backend, actual=self.backend if opened else "none",
                           detail="" if opened else probe.get("reason", "no session opened"))

    def placement_from(self, nodes: list[tuple[str, str]], log: list[str]) -> list[PlacementRow]:
        """Each of the model's (op_type, name) nodes where ORT's verbose log placed it."""
        placed = placement_from_log(log, nodes)
        if not placed:  # nothing logged: claim no placement rather than assume the accelerator
            return [PlacementRow(name, op, NOT_LOGGED, False) for op, name in nodes]
        everything_on = [ep for ep, listed in placed.items() if not listed]  # "All nodes placed on [EP]"
        if everything_on and everything_on[0] != self.ort_ep:
            return [PlacementRow(name, op, everything_on[0], True) for op, name in nodes]
        return placement_rows(nodes, placed, self.ort_ep, self.where_label)

    def variant_note(self, probe: dict, variant: str) -> str:
        """What the backend line must add about this variant on this device ('' : nothing)."""
        return ""


class OrtWebWasm(OrtWebTarget):
    name = "ort-web-wasm"
    summary = "onnxruntime-web in headless Chromium, WebAssembly (CPU) backend"
    backend = "wasm"
    bundle = "ort.wasm.min.mjs"
    ort_ep = "CPUExecutionProvider"
    where_label = "CPUExecutionProvider (wasm)"


class OrtWebWebgl(OrtWebTarget):
    name = "ort-web-webgl"
    summary = "onnxruntime-web in headless Chromium, WebGL backend (no CPU fallback, fixed batch)"
    backend = "webgl"
    bundle = "ort.webgl.min.mjs"
    ort_ep = None
    where_label = "WebGL"
    fixed_batch_copy = True

    def verify_backend(self, probe: dict, log: list[str], opened: bool, rows: list[PlacementRow]) -> BackendInfo:
        if not probe["present"]:
            return BackendInfo(self.backend, "none", detail=probe["reason"])
        return BackendInfo(self.backend, self.backend, emulated=self.emulated_on(probe), detail=probe.get("renderer", ""))

    def emulated_on(self, probe: dict) -> bool:
        return probe["present"] and "swiftshader" in probe.get("renderer", "").lower()

    def placement_from(self, nodes: list[tuple[str, str]], log: list[str]) -> list[PlacementRow]:
        """WebGL is not an ORT EP: a session runs every node or fails to open."""
        return [PlacementRow(name, op, self.where_label, False) for op, name in nodes]


class OrtWebWebgpu(OrtWebTarget):
    name = "ort-web-webgpu"
    summary = "onnxruntime-web in headless Chromium, WebGPU backend (JSEP; unsupported ops fall back to wasm)"
    backend = "webgpu"
    bundle = "ort.min.mjs"
    ort_ep = "JsExecutionProvider"
    where_label = "JsExecutionProvider (WebGPU)"

    def verify_backend(self, probe: dict, log: list[str], opened: bool, rows: list[PlacementRow]) -> BackendInfo:
        """Read from the placement rows, so the backend check and the placement table never disagree."""
        if not probe["present"]:
            return BackendInfo(self.backend, "none", detail=probe["reason"])
        adapter = _adapter(probe)
        emulated = self.emulated_on(probe)
        on_gpu = [row for row in rows if row.where == self.where_label]
        if on_gpu:
            fell_back = [row for row in rows if row.fallback]
            detail = f"adapter {adapter}" + ("; isFallbackAdapter" if probe["isFallbackAdapter"] else "")
            if fell_back:
                detail += f"; no WebGPU kernel for {len(fell_back)} node(s), run on CPU"
            return BackendInfo(self.backend, self.backend, emulated=emulated, detail=detail)
        if rows and all(row.where != NOT_LOGGED for row in rows):
            # The adapter and the EP were there; ORT placed every node elsewhere. That is a total fallback
            # (the placement rows say so, judged like any runtime's by matrix/judge/rules.backend), not a missing backend.
            where = sorted({row.where for row in rows})
            return BackendInfo(self.backend, self.backend, emulated=emulated,
                               detail=f"adapter {adapter}; ORT placed no node on {self.ort_ep}; all ran on {', '.join(where)}")
        return BackendInfo(self.backend, UNREAD, emulated=emulated, detail="ORT logged no node placement")

    def emulated_on(self, probe: dict) -> bool:
        return probe["present"] and (probe["isFallbackAdapter"] or "swiftshader" in _adapter(probe).lower())

    def variant_note(self, probe: dict, variant: str) -> str:
        # Measured on onnxruntime-web 1.30: without shader-f16 the WebGPU EP accepts an fp16
        # model and returns wrong numbers (0.79 max drift) instead of refusing it. Devices
        # without the feature exist in the field, so the drift is reported, not skipped.
        if variant == "fp16" and not probe.get("shaderF16"):
            return "; the adapter has no shader-f16: onnxruntime-web still runs fp16 models on it"
        return ""


def _adapter(probe: dict) -> str:
    """The WebGPU adapter as the probe named it: "vendor=…, architecture=…, description=…"."""
    return ", ".join(f"{key}={probe[key]}" for key in ("vendor", "architecture", "description") if probe.get(key))
