"""Chromium for the browser targets: one browser per worker, an isolated context and page per target.

A worker launches one Chromium through Playwright, which drives it over a pipe
(`--remote-debugging-pipe`): no DevTools port is open, so no other local process can
drive the browser (a DevTools port on 127.0.0.1 lets any local user's process read files
through it). The browser is the worker's child: the worker's memory cap holds for it and
it ends with the worker (the pipe closes), on a timeout or a kill -9 alike. Only a browser
the user started and owns (`--browser-endpoint`, `UserBrowser`) is reached over CDP.

The three web targets share one worker (Target.worker_group), so one Playwright driver and one
browser, started once per run: the browser is launched with the first target's page and kept when
the worker moves on (`drop_page(keep_browser=True)`: the target's context and its renderer go, the
browser and its GPU process stay), which saves two launches (bench/matrix_wall.py's CPU by process kind);
it is closed when the worker exits. Each target gets its own fresh context and page
(`HarnessPage`: a private local server for the harness, the ORT dist/ files and published
models, and one ORT bundle imported), kept for all the variants it serves; contexts share no storage, cache or origin. A browser that
dies is launched afresh for the next page. Nothing here knows an ORT backend: that is
targets/ort_web.py's business.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from .base import RunService
from .paths import cache_dir
from .web_support import HarnessServer, missing_npm_package

# A user's own browser instead of the one policy-matrix starts (`run --browser-endpoint / --browser-path`),
# e.g. a desktop Chrome with a real GPU: the same harness, its real adapter, its real latency.
BROWSER_ENDPOINT_ENV = "POLICY_MATRIX_BROWSER_ENDPOINT"  # DevTools endpoint of a running Chrome: ws://… or http://…
BROWSER_PATH_ENV = "POLICY_MATRIX_BROWSER_PATH"  # a Chrome / Chromium executable to launch
# Chromium's headless shell first where it is installed (Playwright's: `playwright install chromium-headless-shell`;
# Debian's: chromium-headless-shell): the same Blink, V8,
# ANGLE and Dawn as the full browser, and the headless browser Playwright itself launches, without the full
# browser's window, tab strip and address bar, which its headless mode still builds for every page: the
# browser process's CPU in a run of the three web targets fell from 2.4 to 0.9 s, the run's from 15.6 to
# 13.2 s, its peak RSS from 1.21 to 1.00 GiB (bench/web_phases.py, bench/matrix_wall.py).
# The binary itself: Debian's /usr/bin/chromium-headless-shell wrapper runs it as a child of a shell instead of
# exec'ing it, which leaves the browser one process removed from the one Playwright launched and ends.
DEBIAN_HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"
SYSTEM_CHROMIUM = (
    DEBIAN_HEADLESS_SHELL,
    "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome",  # Debian, Ubuntu, CI runners
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome", "/Applications/Chromium.app/Contents/MacOS/Chromium",
)
# Chromium obeys only the last --disable-features of its command line, and Playwright puts its own list
# before ours: ours repeats Playwright's (1.65's; tests/test_web_targets.py checks the installed release's
# is inside it) and adds browser parts a run never uses, which cost a page more than the page itself (its
# renderer ~115 MiB RSS): the address bar's popup, which Chromium pre-renders for every window, headless
# too, in a renderer of its own (~157 MiB RSS and ~1.3 CPU s per page opened), and a spare renderer kept
# ready for the next navigation (~74 MiB for the browser's life). None runs in the page measured.
PLAYWRIGHT_DISABLED_FEATURES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose", "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable", "LensOverlay", "MediaRouter", "PaintHolding", "ThirdPartyStoragePartitioning",
    "AvoidCorsURLLoaderRestartOnRedirect", "TcpPortRandomizationWin", "OptimizationHints", "NetworkTimeServiceQuerying",
    "AimEnabled", "PreconnectToSearch", "msForceBrowserSignIn", "msEdgeUpdateLaunchServicesPreferredVersion",
)
UNUSED_FEATURES = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup",
                   "SpareRendererForSitePerProcess")
# --enable-features likewise: ours repeats Playwright's list and runs the network service inside the browser
# process, as Chromium does on Android: its own process (~100 MiB RSS, ~40 MiB PSS) serves nothing but the
# harness's local server here, and the renderers' loads no longer cross one process more.
PLAYWRIGHT_ENABLED_FEATURES = ("CDPScreenshotNewSurface", "SkipListAccountsWithoutGaiaCookies")
IN_PROCESS_FEATURES = ("NetworkServiceInProcess2",)
# A fresh profile per run and no background traffic (the network here is closed,
# and a default profile floods refused connections); WebGPU needs the unsafe flag.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--no-default-browser-check", "--enable-unsafe-webgpu",
    "--disable-features=" + ",".join((*PLAYWRIGHT_DISABLED_FEATURES, *UNUSED_FEATURES)),
    "--enable-features=" + ",".join((*PLAYWRIGHT_ENABLED_FEATURES, *IN_PROCESS_FEATURES)),
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
    """The user's --browser-path; else a Playwright-managed Chromium when one is installed, its headless shell first,
    else the system Chromium, its headless shell first."""
    if user_path := os.environ.get(BROWSER_PATH_ENV):
        return user_path
    if playwright_missing() is None:
        if shell := managed_headless_shell():
            return shell
        if _may_hold_managed_chromium():
            from playwright.sync_api import sync_playwright

            try:
                with sync_playwright() as playwright:
                    managed = playwright.chromium.executable_path
                if managed and Path(managed).exists():
                    return managed
            except Exception:  # noqa: BLE001 — no managed browser is an ordinary answer
                pass
    return next((path for path in SYSTEM_CHROMIUM if Path(path).exists()), None) or shutil.which("chromium")


def playwright_browsers_dir() -> Path:
    """Where Playwright keeps the browsers it installs, by its registry's rule: PLAYWRIGHT_BROWSERS_PATH ("0": inside
    its package; a relative one from the working folder), else ms-playwright in the user's cache folder."""
    chosen = os.environ.get("PLAYWRIGHT_BROWSERS_PATH")
    if chosen == "0":
        return _playwright_package() / ".local-browsers"
    if chosen:
        return Path(os.environ.get("INIT_CWD") or os.getcwd(), chosen)  # an absolute `chosen` replaces the first part
    if sys.platform == "darwin":
        cache = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        cache = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ms-playwright"


def _playwright_package() -> Path:
    """The Playwright driver's package folder (its browsers.json, its .local-browsers)."""
    import playwright

    return Path(playwright.__file__).parent / "driver" / "package"


def managed_headless_shell() -> str | None:
    """Playwright's own headless shell (`playwright install chromium-headless-shell`, or `--only-shell`) at the
    revision the installed Playwright drives, once its download completed: the folder and file names its registry
    gives it (chromium_headless_shell-REVISION/chrome-headless-shell-PLATFORM/chrome-headless-shell). No driver is
    started to find it: Playwright's API names only the full browser's path."""
    try:
        listed = json.loads((_playwright_package() / "browsers.json").read_text())["browsers"]
        revision = next(browser["revision"] for browser in listed if browser["name"] == "chromium-headless-shell")
    except (OSError, ValueError, KeyError, StopIteration):  # a Playwright without one: none to find
        return None
    folder = playwright_browsers_dir() / f"chromium_headless_shell-{revision}"
    try:  # a PLAYWRIGHT_BROWSERS_PATH the system cannot look into (a name too long) holds none
        if not (folder / "INSTALLATION_COMPLETE").exists():
            return None
        found = sorted([*folder.glob("*/chrome-headless-shell"), *folder.glob("*/chrome-headless-shell.exe")])
        return next((str(path) for path in found if path.is_file() and os.access(path, os.X_OK)), None)
    except OSError:
        return None


def _may_hold_managed_chromium() -> bool:
    """False when Playwright's browser folder holds no chromium-* install (or cannot be looked into), so no
    Playwright driver (0.6-1.7 s) is started just to learn that none is there."""
    try:
        return any(playwright_browsers_dir().glob("chromium-*"))
    except OSError:
        return False


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
    if not found:
        return f"Chromium at {executable}"
    # The headless shell calls itself "Chromium 156…" too: the report says which browser ran the page.
    shell = " headless shell" if "headless" in Path(executable).name and "headless" not in found.group(1).lower() else ""
    return f"{found.group(1)}{shell} {found.group(2)}"


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
def playwright_driver():
    """One Playwright driver per process: its sync API allows only one per thread (a second `sync_playwright()`
    in a thread whose driver runs fails), and pages of several bundles (a test session, a benchmark) live side by side."""
    from playwright.sync_api import sync_playwright

    with node_compile_cache():
        return sync_playwright().start()


NODE_COMPILE_CACHE_ENV = "NODE_COMPILE_CACHE"


@contextlib.contextmanager
def node_compile_cache():
    """Node (22.1+) started meanwhile keeps V8's compiled code of the modules it loads in the cache folder and
    reads it back next time: the Playwright driver (node 26) compiles its ~7 MB of bundled JavaScript once per
    machine, not once per run (its start is most of the driver's CPU: bench/web_phases.py; driver CPU for a start,
    a launch, a page and 50 evaluates fell by a median 0.13 s). Node keys the files by its own version and each
    file's hash, writes them only when something new was compiled, and runs uncached when the folder cannot be
    written; a user's NODE_COMPILE_CACHE (or NODE_DISABLE_COMPILE_CACHE) stays theirs. Set only while the driver
    starts: ort-node's runner runs on the system's node (20 here: no compile cache), and under node 26 its start
    cost the same with the cache or without (0.17 CPU s)."""
    if NODE_COMPILE_CACHE_ENV in os.environ:
        yield
        return
    try:
        folder = cache_dir() / "node-compile-cache"
    except OSError:  # no cache folder: node runs as it would without one
        yield
        return
    os.environ[NODE_COMPILE_CACHE_ENV] = str(folder)
    try:
        yield
    finally:
        os.environ.pop(NODE_COMPILE_CACHE_ENV, None)


class _BrowserUse:
    """A browser of this process and how many HarnessPages hold a context in it."""

    def __init__(self, browser):
        self.browser, self.pages = browser, 0


_BROWSERS: dict[tuple, _BrowserUse] = {}  # per (endpoint, flags): launched with its first page, closed with its last (or at exit)


def _browser_key() -> tuple:
    return os.environ.get(BROWSER_ENDPOINT_ENV), tuple(CHROMIUM_FLAGS)


def _hold_browser(key: tuple):
    """The process's browser for `key`, launched (or connected, with --browser-endpoint) when there is none
    or the one there died; the caller releases it with _release_browser."""
    use = _BROWSERS.get(key)
    if use is None or not use.browser.is_connected():
        endpoint, flags = key
        chromium = playwright_driver().chromium
        browser = chromium.connect_over_cdp(endpoint) if endpoint else chromium.launch(
            executable_path=chromium_executable(), args=list(flags))
        use = _BROWSERS[key] = _BrowserUse(browser)
    use.pages += 1
    return use.browser


def _release_browser(key: tuple, browser, keep: bool) -> None:
    """A page is done with `browser`: the last one closes it unless `keep` asks to leave it open for the
    process's next page (a dead browser, or one that was replaced, is closed at once)."""
    use = _BROWSERS.get(key)
    if use is not None and use.browser is browser:
        use.pages -= 1
        if use.pages > 0 or (keep and browser.is_connected()):
            return
        del _BROWSERS[key]
    with contextlib.suppress(Exception):  # a dead browser has nothing left to close
        browser.close()  # the user's browser (--browser-endpoint): only disconnects


# True once the page set window.harness up; once the page loaded without it, {said: what went wrong as the page saw
# it}: index.html's first error (window.harnessFailure) and each file the server refused, the page itself included (a
# 404 page is a page too); '' when it saw nothing (Chromium's own error page: the request got no answer at all).
_HARNESS_LOADED = """() => {
  if (window.harness !== undefined) return true;
  if (document.readyState !== 'complete') return false;
  const refused = [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]
    .filter((entry) => entry.responseStatus >= 400)
    .map((entry) => `${new URL(entry.name).pathname} answered HTTP ${entry.responseStatus}`);
  return { said: [window.harnessFailure, ...refused].filter(Boolean).join('; ') };
}"""


class HarnessPage:
    """A fresh context and page in this worker's browser (the user's, with --browser-endpoint)."""

    def __init__(self, bundle: str):
        self.browser_key = _browser_key()
        self.browser = _hold_browser(self.browser_key)
        self.answers: dict[tuple, object] = {}  # call_once's
        self.unanswered: list[str] = []  # requests of the page that failed without an answer (read if it fails to load)
        try:
            self.server = HarnessServer()
            self.page = self._page_at(f"{self.server.origin}/harness/index.html")
            self._wait_for_harness()
            self.versions = self._load(bundle)
        except BaseException:
            self.close()
            raise

    def _wait_for_harness(self) -> None:
        """Until the page has set window.harness up; a page that loaded without it fails at once in its own words (a
        module that could not be fetched, an error thrown while setting up, the page itself missing), where waiting
        for window.harness ran out Playwright's 30 s timeout and said only that. harness.mjs has no top-level await:
        once the document is complete, its modules have run."""
        outcome = self.page.wait_for_function(_HARNESS_LOADED).json_value()
        if outcome is not True:
            said = outcome["said"] or "; ".join(self.unanswered) or f"no window.harness at {self.page.url}"
            raise RuntimeError(f"the web harness did not load: {said}")

    def _load(self, bundle: str) -> dict:
        """Import the ORT bundle in the page; one that cannot be fetched or throws as it is imported is named."""
        try:
            return self.call("load", f"{self.server.origin}/ort/{bundle}", f"{self.server.origin}/ort/")
        except RuntimeError as error:
            raise RuntimeError(f"onnxruntime-web's {bundle} did not load in the page: {error}") from None

    def _page_at(self, url: str):
        """A fresh context (self.context) and its one page, created at `url` by CDP's Target.createTarget.
        Playwright's new_page opens about:blank first, in a renderer the cross-origin-isolated harness cannot
        share: every target's page started and ended a renderer for nothing (a page was ready in 0.42 s instead
        of 0.55, and the processes that outlive it spent 0.04 CPU s less, the about:blank renderer's own CPU
        besides; medians of 6, load ~10). Playwright attaches to the page as to any page its context opens
        (paused until it is set up), so it is driven like one from new_page."""
        cdp = self.browser.new_browser_cdp_session()
        try:
            known = set(cdp.send("Target.getBrowserContexts")["browserContextIds"])
            self.context = self.browser.new_context()
            # A request that got no answer (the page itself: no error event in it says why) is kept for the load's failure.
            self.context.on("requestfailed", lambda request: self.unanswered.append(
                f"{urllib.parse.urlsplit(request.url).path}: {request.failure}"))
            # The one context id that appeared (only this thread makes contexts in a browser the worker launched;
            # in a user's browser another one appearing at this very moment fails this page rather than pick one).
            (context_id,) = set(cdp.send("Target.getBrowserContexts")["browserContextIds"]) - known
            with self.context.expect_page() as opened:
                cdp.send("Target.createTarget", {"url": url, "browserContextId": context_id})
            return opened.value
        finally:
            cdp.detach()

    def call(self, function: str, *args):
        """Call window.harness[function](...args) in the page; raise with ORT's own message."""
        reply = self.page.evaluate(f"(args) => window.harness.{function}(...args)", list(args))
        if not reply["ok"]:
            raise RuntimeError(reply["error"])
        return reply["result"]

    def call_once(self, function: str, *args):
        """`call`, answered once for the page's life: what the page's device is (its adapter, its renderer)."""
        key = (function, *args)
        if key not in self.answers:
            self.answers[key] = self.call(function, *args)
        return self.answers[key]

    def close(self, keep_browser: bool = False) -> None:
        """Close the context (its renderer goes) and the server; the browser too when this was its last
        page, unless `keep_browser`."""
        if self.browser is None:
            return
        for step in ("context", "server"):
            resource = getattr(self, step, None)
            try:
                if resource is not None:
                    resource.stop() if step == "server" else resource.close()
            except Exception:  # noqa: BLE001 — a dead browser has nothing left to close
                pass
        _release_browser(self.browser_key, self.browser, keep_browser)
        self.browser = None


_PAGES: dict[tuple, HarnessPage] = {}  # this worker's page per (ORT bundle, browser), shared by the variants it serves


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
    return bundle, *_browser_key()


def drop_page(bundle: str, keep_browser: bool = False) -> None:
    if (page := _PAGES.pop(_page_key(bundle), None)) is not None:
        page.close(keep_browser)


@atexit.register
def _close_pages() -> None:
    while _PAGES:
        _PAGES.popitem()[1].close()
    while _BROWSERS:  # pages opened outside _PAGES (a test, a benchmark) and never closed
        with contextlib.suppress(Exception):
            _BROWSERS.popitem()[1].browser.close()
    if playwright_driver.cache_info().currsize:
        with contextlib.suppress(Exception):
            playwright_driver().stop()
