"""onnxruntime-web inside headless Chromium: wasm, WebGL and WebGPU backends.

One Chromium per run (`ChromiumService`, shared by the three targets through
`service_key`); each target's worker connects to it over CDP and gets a fresh
browser context and page (kept for all the variants it serves; each variant's
ORT sessions are released after it), a private local server for the harness, the ORT
dist/ files and this cell's model, and one ORT bundle. Latency is measured in
the page with performance.now() (cross-origin isolated, so not coarsened);
placement comes from ORT's own verbose log; the backend that really ran is
checked, and a software adapter (SwiftShader) is labelled emulated.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import ClassVar

from matrix import isolation

from .base import NO_SETTINGS, Artifact, BackendInfo, Feeds, PlacementRow, RunService, Session, Settings, Target
from .web_support import (
    HarnessServer,
    decode_outputs,
    encode_feeds,
    fixed_batch_model,
    missing_npm_package,
    model_nodes,
    npm_package_version,
    placement_from_log,
    placement_rows,
)

CDP_ENV = "POLICY_MATRIX_CDP_URL"
# A user's own browser instead of the one policy-matrix starts (`run --browser-endpoint / --browser-path`),
# e.g. a desktop Chrome with a real GPU: the same harness, its real adapter, its real latency.
BROWSER_ENDPOINT_ENV = "POLICY_MATRIX_BROWSER_ENDPOINT"  # DevTools endpoint of a running Chrome: ws://… or http://…
BROWSER_PATH_ENV = "POLICY_MATRIX_BROWSER_PATH"  # a Chrome / Chromium executable to launch
# A software (SwiftShader) adapter's latency means nothing and a conv policy at
# batch 64 takes ~0.3 s per call there: time a few calls, not the run's hundreds.
EMULATED_WARMUP, EMULATED_ITERS = 3, 20
SYSTEM_CHROMIUM = (
    "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome",  # Debian, Ubuntu, CI runners
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome", "/Applications/Chromium.app/Contents/MacOS/Chromium",
)
# A fresh profile per run and no background traffic (the network here is closed,
# and a default profile floods refused connections); WebGPU needs the unsafe flag.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--no-default-browser-check", "--enable-unsafe-webgpu",
]


@functools.cache
def playwright_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python package playwright is not installed: run `policy-matrix setup web`"
    return None


@functools.cache
def chromium_executable() -> str | None:
    """The user's --browser-path; else a Playwright-managed Chromium when one is installed, else the system Chromium."""
    if user_path := os.environ.get(BROWSER_PATH_ENV):
        return user_path
    if playwright_missing() is None:
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as playwright:
                managed = playwright.chromium.executable_path
            if managed and Path(managed).exists():
                return managed
        except Exception:  # noqa: BLE001 — no managed browser is an ordinary answer
            pass
    return next((path for path in SYSTEM_CHROMIUM if Path(path).exists()), None) or shutil.which("chromium")


@functools.cache
def chromium_version() -> str:
    if endpoint := os.environ.get(BROWSER_ENDPOINT_ENV):
        try:
            return f"{user_browser_version(endpoint)} at --browser-endpoint"
        except (OSError, ValueError):
            return "no browser answers at --browser-endpoint"
    executable = chromium_executable()
    if executable is None:
        return "no Chromium"
    result = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30)
    # "Chromium 156.0.8078.108 built on Debian ..." -> "Chromium 156.0.8078.108"
    found = re.search(r"([A-Za-z][A-Za-z ]*?) (\d+(?:\.\d+)+)", result.stdout)
    return f"{found.group(1)} {found.group(2)}" if found else f"Chromium at {executable}"


def web_unavailable_reason() -> str | None:
    if reason := playwright_missing() or missing_npm_package("onnxruntime-web"):
        return reason
    if os.environ.get(BROWSER_ENDPOINT_ENV):
        return None  # the user's browser: whether it answers is checked when the run starts it
    if (user_path := os.environ.get(BROWSER_PATH_ENV)) and not os.access(user_path, os.X_OK):
        return f"--browser-path {user_path}: not an executable file"
    if chromium_executable() is None:
        return ("no Chromium found: run `policy-matrix setup web` (installs Debian's chromium as root), "
                "or `python -m playwright install chromium`")
    return None


# --- one browser per run ----------------------------------------------------


class ChromiumService(RunService):
    """Chromium with a DevTools endpoint on 127.0.0.1; cell workers connect over CDP."""

    def __init__(self, run_dir: Path, startup_timeout_s: float = 60, flags: list[str] = CHROMIUM_FLAGS):
        self.profile = Path(tempfile.mkdtemp(prefix="policy-matrix-chromium-"))
        log = open(self.profile / "chromium.log", "wb")  # noqa: SIM115 — lives as long as the process
        command = [chromium_executable(), *flags, f"--user-data-dir={self.profile}",
                   "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"]
        # Own process group, so stop() ends the browser's helper processes with it; and gone with
        # the runner even on its kill -9, so no browser outlives the run.
        self.process = isolation.start_dying_with_parent(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self.endpoint = self._wait_for_endpoint(startup_timeout_s)

    def _wait_for_endpoint(self, timeout_s: float) -> str:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Chromium exited at start (code {self.process.returncode}): "
                                   f"{(self.profile / 'chromium.log').read_text(errors='replace')[-2000:]}")
            if port_file.exists() and port_file.read_text().strip():
                return f"http://127.0.0.1:{port_file.read_text().split()[0]}"
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Chromium opened no DevTools port within {timeout_s:.0f} s")

    def env(self) -> dict[str, str]:
        return {CDP_ENV: self.endpoint}

    def alive(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.endpoint}/json/version", timeout=5) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                if self.process.poll() is None:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


def devtools_http(endpoint: str) -> str:
    """http://host:port of a DevTools endpoint given as ws://host:port/devtools/browser/<id> or http://host:port."""
    parsed = urllib.parse.urlsplit(endpoint)
    if parsed.scheme not in ("ws", "wss", "http", "https") or not parsed.hostname or parsed.port is None:
        raise ValueError(f"{endpoint!r} is neither ws://HOST:PORT/devtools/browser/… nor http://HOST:PORT")
    scheme = "https" if parsed.scheme in ("wss", "https") else "http"
    return f"{scheme}://{parsed.hostname}:{parsed.port}"


def user_browser_version(endpoint: str) -> str:
    """The "Browser" line of a DevTools endpoint's /json/version, e.g. "Chrome/131.0.6778.85"."""
    with urllib.request.urlopen(f"{devtools_http(endpoint)}/json/version", timeout=10) as reply:
        return json.load(reply).get("Browser", "unknown browser")


class UserBrowser(RunService):
    """A browser the user started and still owns: cells connect to it over CDP; the run never stops it.

    The harness is served on 127.0.0.1, so the browser must run on this machine."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        try:
            self.version = user_browser_version(endpoint)
        except (OSError, ValueError) as error:
            raise RuntimeError(f"--browser-endpoint {endpoint}: no DevTools endpoint answers there ({error})") from None

    def env(self) -> dict[str, str]:
        return {BROWSER_ENDPOINT_ENV: self.endpoint}

    def alive(self) -> bool:
        try:
            user_browser_version(self.endpoint)
        except (OSError, ValueError):
            return False
        return True

    def stop(self) -> None:
        pass  # the user's browser outlives the run


# --- one page per cell -----------------------------------------------------------


@functools.cache
def _driver():
    """One Playwright driver per process: its sync API allows only one per thread, and pages of
    several bundles (a test session, a benchmark) live side by side."""
    from playwright.sync_api import sync_playwright

    return sync_playwright().start()


class HarnessPage:
    """A fresh context and page in the run's browser (a private browser when no service runs)."""

    def __init__(self, bundle: str):
        self.playwright = _driver()
        try:
            endpoint = os.environ.get(BROWSER_ENDPOINT_ENV) or os.environ.get(CDP_ENV)
            if endpoint:
                self.browser = self.playwright.chromium.connect_over_cdp(endpoint)
            else:
                self.browser = self.playwright.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_FLAGS)
            self.context = self.browser.new_context()
            self.page = self.context.new_page()
            self.server = HarnessServer()
            self.page.goto(f"{self.server.origin}/harness/index.html")
            self.page.wait_for_function("window.harness !== undefined")
            self.versions = self.call("load", f"{self.server.origin}/ort/{bundle}", f"{self.server.origin}/ort/")
        except BaseException:
            self.close()
            raise

    def call(self, function: str, *args):
        """Call window.harness[function](...args) in the page; raise with ORT's own message."""
        reply = self.page.evaluate(f"(args) => window.harness.{function}(...args)", list(args))
        if not reply["ok"]:
            raise RuntimeError(reply["error"])
        return reply["result"]

    def close(self) -> None:
        for step in ("context", "browser", "server"):
            resource = getattr(self, step, None)
            try:
                if resource is not None:
                    resource.stop() if step == "server" else resource.close()
            except Exception:  # noqa: BLE001 — a dead browser has nothing left to close
                pass


_PAGES: dict[tuple, HarnessPage] = {}  # this worker's page per (ORT bundle, browser), shared by the variants it serves
_SESSION_KEYS = itertools.count()  # session names unique within a shared page


def shared_page(bundle: str) -> HarnessPage:
    """The worker's page for `bundle`, opened on first use: the browser context, the page and
    the ORT bundle's import are paid once per target, not per variant. A page that died is replaced."""
    key = _page_key(bundle)
    page = _PAGES.get(key)
    if page is not None and (page.page.is_closed() or not page.browser.is_connected()):
        drop_page(bundle)
        page = None
    if page is None:
        page = _PAGES[key] = HarnessPage(bundle)
    return page


def _page_key(bundle: str) -> tuple:
    return bundle, os.environ.get(BROWSER_ENDPOINT_ENV) or os.environ.get(CDP_ENV)


def drop_page(bundle: str) -> None:
    if (page := _PAGES.pop(_page_key(bundle), None)) is not None:
        page.close()


@atexit.register
def _close_pages() -> None:
    while _PAGES:
        _PAGES.popitem()[1].close()
    if _driver.cache_info().currsize:
        with contextlib.suppress(Exception):
            _driver().stop()


NOT_LOGGED = "not logged"  # placement when ORT printed none: neither accelerator nor fallback is claimed


class WebSession(Session):
    """One onnxruntime-web session per batch size in a fresh page (WebGL needs fixed shapes)."""

    def __init__(self, target: OrtWebTarget, artifact: Artifact, threads: int):
        self.target, self.artifact, self.threads = target, artifact, threads
        self.page = shared_page(target.bundle)
        self.sessions: dict[int | None, dict] = {}
        try:
            self.probe = self.page.call("probe", target.backend)
            if self.probe["present"]:
                self._session_for(1 if target.fixed_batch else None)
        except BaseException:
            drop_page(target.bundle)  # a page that failed here is not trusted with the next variant
            raise

    def _session_for(self, batch: int | None) -> dict:
        if not self.probe["present"]:
            raise RuntimeError(self.probe["reason"])
        if batch not in self.sessions:
            model = self.artifact.path
            if batch is not None:
                model = fixed_batch_model(model, batch, self.artifact.cache_dir)
            key = f"s{next(_SESSION_KEYS)}-b{batch}"
            url = self.page.server.publish(model)
            opened = self.page.call("open", key, url, self.target.backend, self.threads, True)
            self.sessions[batch] = {"key": key, "log": opened["log"]}
        return self.sessions[batch]

    def _key(self, feeds: Feeds) -> str:
        batch = next(iter(feeds.values())).shape[0] if self.target.fixed_batch else None
        return self._session_for(batch)["key"]

    def run(self, feeds: Feeds) -> Feeds:
        return decode_outputs(self.page.call("run", self._key(feeds), encode_feeds(feeds)))

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        if self.backend().emulated:  # software adapter: latency is not the point, keep the cell short
            warmup, iters = min(warmup, EMULATED_WARMUP), min(iters, EMULATED_ITERS)
        return self.page.call("time", self._key(feeds), encode_feeds(feeds), warmup, iters)

    def bare_loop_ns(self, feeds: Feeds, iters: int) -> float:
        """Mean ns per call of a bare session.run loop in the same page (for bench/web_overhead.py)."""
        return self.page.call("bareLoop", self._key(feeds), encode_feeds(feeds), iters)

    def _first_log(self) -> list[str]:
        return next(iter(self.sessions.values()))["log"] if self.sessions else []

    def placement(self) -> list[PlacementRow]:
        """The one source of truth for where nodes ran; the backend check reads these rows too."""
        nodes = model_nodes(self.artifact.path)
        if self.target.ort_ep is None:  # WebGL is not an ORT EP: a session runs every node or fails
            return [PlacementRow(name, op, self.target.where_label, False) for op, name in nodes]
        placed = placement_from_log(self._first_log())
        if not placed:  # nothing logged: claim no placement rather than assume the accelerator
            return [PlacementRow(name, op, NOT_LOGGED, False) for op, name in nodes]
        everything_on = [ep for ep, listed in placed.items() if not listed]  # "All nodes placed on [EP]"
        if everything_on and everything_on[0] != self.target.ort_ep:
            return [PlacementRow(name, op, everything_on[0], True) for op, name in nodes]
        return placement_rows(nodes, placed, self.target.ort_ep, self.target.where_label)

    def backend(self) -> BackendInfo:
        rows = self.placement() if self.sessions else []
        info = self.target.verify_backend(self.probe, self._first_log(), bool(self.sessions), rows)
        info.timer_resolution_us = self.page.versions.get("timerStepUs")
        if info.emulated:
            info.detail += f"; emulated: parity only, latency from at most {EMULATED_ITERS} calls"
        if self.target.backend == "webgpu" and self.artifact.variant == "fp16" and not self.probe.get("shaderF16"):
            # Measured on onnxruntime-web 1.30: without shader-f16 the WebGPU EP accepts an fp16
            # model and returns wrong numbers (0.79 max drift) instead of refusing it. Devices
            # without the feature exist in the field, so the drift is reported, not skipped.
            info.detail += "; the adapter has no shader-f16: onnxruntime-web still runs fp16 models on it"
        return info

    def close(self) -> None:
        """Release this variant's ORT sessions; the page stays for the next variant of this worker."""
        try:
            for opened in self.sessions.values():
                self.page.call("release", opened["key"])
        except Exception:  # noqa: BLE001 — a page that cannot release is not reused
            drop_page(self.target.bundle)


class OrtWebTarget(Target):
    runs_onnx_as_is = True
    service_key: ClassVar[str] = "chromium"
    backend: ClassVar[str]  # onnxruntime-web executionProviders name
    bundle: ClassVar[str]  # one ORT bundle per page, from the installed dist/
    ort_ep: ClassVar[str | None]  # ORT's name for the EP in its placement log
    where_label: ClassVar[str]
    fixed_batch: ClassVar[bool] = False

    def runtime_version(self) -> str:
        return f"onnxruntime-web {npm_package_version('onnxruntime-web') or '(not installed)'}, {chromium_version()}"

    def unavailable_reason(self) -> str | None:
        return web_unavailable_reason()

    def start_runtime(self) -> None:
        if self.unavailable_reason() is None:
            shared_page(self.bundle)

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        return WebSession(self, artifact, threads)

    def start_service(self, run_dir: Path) -> RunService | None:
        if endpoint := os.environ.get(BROWSER_ENDPOINT_ENV):
            return UserBrowser(endpoint)
        return ChromiumService(run_dir)

    def verify_backend(self, probe: dict, log: list[str], opened: bool, rows: list[PlacementRow]) -> BackendInfo:
        return BackendInfo(requested=self.backend, actual=self.backend if opened else "none",
                           detail="" if opened else probe.get("reason", "no session opened"))


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
    fixed_batch = True

    def variant_skip_reason(self, variant: str) -> str | None:
        # Measured with onnxruntime-web 1.30 on the core's fp16/int8 variants.
        return {
            "fp16": "onnxruntime-web's WebGL backend cannot load float16 tensors (\"unsupported data type: FLOAT16\")",
            "int8": "onnxruntime-web's WebGL backend has no integer-quantized ops "
                    "(\"cannot resolve operator 'DynamicQuantizeLinear'\")",
        }.get(variant) or super().variant_skip_reason(variant)

    def verify_backend(self, probe: dict, log: list[str], opened: bool, rows: list[PlacementRow]) -> BackendInfo:
        if not probe["present"]:
            return BackendInfo(self.backend, "none", detail=probe["reason"])
        renderer = probe.get("renderer", "")
        return BackendInfo(self.backend, self.backend, emulated="swiftshader" in renderer.lower(), detail=renderer)


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
        adapter = ", ".join(f"{key}={probe[key]}" for key in ("vendor", "architecture", "description") if probe.get(key))
        emulated = probe["isFallbackAdapter"] or "swiftshader" in adapter.lower()
        on_gpu = [row for row in rows if row.where == self.where_label]
        if on_gpu:
            fell_back = [row for row in rows if row.fallback]
            detail = f"adapter {adapter}" + ("; isFallbackAdapter" if probe["isFallbackAdapter"] else "")
            if fell_back:
                detail += f"; no WebGPU kernel for {len(fell_back)} node(s), run on CPU"
            return BackendInfo(self.backend, self.backend, emulated=emulated, detail=detail)
        if rows and all(row.where != NOT_LOGGED for row in rows):  # every node on the CPU EP: it really ran on wasm
            where = sorted({row.where for row in rows})
            return BackendInfo(self.backend, "wasm", emulated=emulated,
                               detail=f"ORT placed no node on {self.ort_ep}; all ran on {', '.join(where)}")
        return BackendInfo(self.backend, "unknown", emulated=emulated, detail="ORT logged no node placement")



