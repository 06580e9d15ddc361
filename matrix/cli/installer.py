"""`policy-matrix setup GROUP`: what each group of targets needs beyond the core wheel.

One way to set up, from a checkout (the Makefile calls this) or from
`pip install policy-matrix`: npm packages of the web harness, Python Playwright,
a Chromium, the runtimes that are plain pip extras, and the converter
environments. Every step checks first and only acts on what is missing, so a
second run does nothing and prints nothing (`-v` lists what is already there).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import Requirement
from rich.console import Console
from rich.markup import escape

NPM_STAMP = ".policy-matrix-lock-sha256"  # in node_modules: the package-lock.json it was installed from


class SetupError(RuntimeError):
    """A step that could not do its work; the message says why in one line."""


class Reporter:
    """Spinner while a step works (rich), one line when it did something; quiet when nothing was needed."""

    def __init__(self, console: Console, verbosity: int):
        self.console, self.verbosity = console, verbosity

    @contextlib.contextmanager
    def work(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        with self.console.status(escape(what)):
            yield
        if self.verbosity >= 0:
            self.console.print(f"[green]done[/] {escape(what)} in {time.monotonic() - started:.0f} s", highlight=False,
                               soft_wrap=True)

    def ok(self, what: str) -> None:
        if self.verbosity > 0:
            self.console.print(f"[green]ok[/] {escape(what)}", highlight=False, soft_wrap=True)

    def warn(self, what: str) -> None:
        self.console.print(f"[yellow]warning[/] {escape(what)}", highlight=False, soft_wrap=True)


# --- pip ----------------------------------------------------------------------------


def unmet(requirements: list[str]) -> list[str]:
    """The requirements this interpreter does not satisfy yet."""
    missing = []
    for line in requirements:
        requirement = Requirement(line)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            missing.append(line)
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            missing.append(line)
    return missing


def pip_install(report: Reporter, requirements: list[str], why: str) -> None:
    missing = unmet(requirements)
    if not missing:
        report.ok(f"{', '.join(requirements)} ({why})")
        return
    with report.work(f"pip install {' '.join(missing)} ({why})"):
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *missing],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"pip install {' '.join(missing)} failed: {_last_line(done.stderr)}")


def extra_requirements(extra: str) -> list[str]:
    """The pins of one of policy-matrix's extras, from its installed metadata (pyproject.toml is the one source)."""
    found = []
    for line in requires("policy-matrix") or []:
        requirement = Requirement(line)
        if requirement.marker and requirement.marker.evaluate({"extra": extra}):
            requirement.marker = None
            found.append(str(requirement))
    return found


# --- the steps ------------------------------------------------------------------------


def core_runtimes(report: Reporter) -> None:
    """tract: an independent ONNX runtime that is a plain pip package."""
    pip_install(report, extra_requirements("tract"), "runs the tract target")


def npm_packages(report: Reporter) -> None:
    """onnxruntime-web and onnxruntime-node, exactly as package-lock.json pins them."""
    from targets import web_support

    place = web_support.install_dir()
    lock = (web_support.PACKAGED_HARNESS / "package-lock.json").read_bytes()
    digest = hashlib.sha256(lock).hexdigest()
    stamp = place / "node_modules" / NPM_STAMP
    if stamp.exists() and stamp.read_text() == digest:
        report.ok(f"npm packages in {place / 'node_modules'}")
        return
    npm = shutil.which("npm")
    if npm is None:
        report.warn("npm not found: ort-node and ort-web-* stay unavailable (install Node.js >= 18, then run setup web again)")
        return
    if place != web_support.PACKAGED_HARNESS:
        _copy_harness(web_support.PACKAGED_HARNESS, place, web_support.HARNESS_FILES)
    # onnxruntime-node's postinstall would download CUDA files (and fails offline): skipped.
    environment = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"}
    with report.work(f"npm ci in {place}"):
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=place, env=environment,
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"npm ci in {place} failed: {_last_line(done.stderr)}")
    stamp.write_text(digest)


def _copy_harness(source: Path, place: Path, names: tuple[str, ...]) -> None:
    """The shipped harness files beside the per-user node_modules (node resolves packages from the script's folder)."""
    place.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (source / name).is_dir():
            shutil.copytree(source / name, place / name, dirs_exist_ok=True)
        else:
            shutil.copy2(source / name, place / name)


def python_playwright(report: Reporter) -> None:
    from targets import web_support

    pins = _requirement_lines(web_support.PACKAGED_HARNESS / "requirements.txt")
    pip_install(report, pins, "drives Chromium for the ort-web-* targets")


def chromium(report: Reporter) -> None:
    """A Playwright-managed Chromium where one exists, else the system's; Debian's package as root, with its
    headless shell (targets/chromium.py: the same engine without the browser UI, ~2 CPU s less a run) where apt has it."""
    from targets import chromium as browser  # this function's own name is `chromium`

    browser.playwright_missing.cache_clear()  # playwright may have been installed by the step before
    browser.chromium_executable.cache_clear()
    found = browser.chromium_executable()
    as_root_with_apt = os.geteuid() == 0 and shutil.which("apt-get")
    if not found and not as_root_with_apt:
        report.warn("no Chromium found: install Chromium or Chrome (see web_harness/README.md), "
                    "or run `python -m playwright install chromium`")
        return
    if not found:
        with report.work("apt-get install chromium"):
            for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
                if (error := _apt(command)) is not None:
                    raise SetupError(error)
    if (as_root_with_apt and found != browser.DEBIAN_HEADLESS_SHELL and (not found or found in browser.SYSTEM_CHROMIUM)
            and _apt_knows(HEADLESS_SHELL_PACKAGE)):  # not every release of every distribution has it: quietly none
        with report.work(f"apt-get install {HEADLESS_SHELL_PACKAGE}"):
            error = _apt(["apt-get", "install", "-y", "-qq", HEADLESS_SHELL_PACKAGE])
        if error is not None:
            report.warn(f"{error}: the web targets run in the full Chromium")
    browser.chromium_executable.cache_clear()
    report.ok(f"Chromium at {browser.chromium_executable()}")


HEADLESS_SHELL_PACKAGE = "chromium-headless-shell"


def _apt_knows(package: str) -> bool:
    """Whether apt's package lists hold `package` (an Ubuntu image has no such package: setup then stays quiet
    instead of warning on every run about a package it cannot have)."""
    return subprocess.run(["apt-cache", "show", package], capture_output=True).returncode == 0


def _apt(command: list[str]) -> str | None:
    """Run an apt-get command; None when it worked, else what failed in apt's last words."""
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return None if done.returncode == 0 else f"{' '.join(command)} failed: {_last_line(done.stderr)}"


def litert_runtime(report: Reporter) -> None:
    pip_install(report, extra_requirements("tflite"), "runs the .tflite files")


def onnx2tf_environment(report: Reporter) -> None:
    from targets import isolated_env
    from targets import tflite

    if not sys.platform.startswith("linux"):
        report.warn("the onnx2tf environment installs on Linux only (its ai-edge-litert pin has no wheel here)")
        return
    _environment(report, "onnx2tf", lambda: isolated_env.env_python(tflite.ENV_NAME, tflite.REQUIREMENTS),
                 tflite.build_environment, "about 2.6 GB, ~2 min")


def coreml_environment(report: Reporter) -> None:
    from targets import isolated_env
    from targets import coreml

    _environment(report, "CoreML", lambda: isolated_env.env_python(coreml.ENV_NAME, coreml.REQUIREMENTS),
                 coreml.build_environment, "about 1.1 GB")


def _environment(report: Reporter, label: str, built: Callable[[], Path | None], build: Callable[[], Path],
                 size: str) -> None:
    if python := built():
        report.ok(f"{label} conversion environment at {python.parent.parent}")
        return
    from targets.isolated_env import EnvError

    with report.work(f"building the {label} conversion environment once ({size})"):
        try:
            build()
        except EnvError as error:
            raise SetupError(str(error)) from None


def framework_environments(report: Reporter) -> None:
    """Each RL framework's pinned environment for `policy-matrix frameworks`; one that fails to
    install is said with pip's words and the others are still built (the table shows it as a row)."""
    from ..frameworks import DEFAULT, environments, load

    failed = []
    for framework in (load(name) for name in DEFAULT):
        if framework.unavailable:
            report.warn(f"{framework.label}: {framework.unavailable}")
            continue
        if environments.python(framework):
            report.ok(f"{framework.label} environment")
            continue
        with report.work(f"building the {framework.label} environment once ({', '.join(framework.pins()) or 'base only'})"):
            try:
                environments.ensure(framework)
            except (environments.BuildFailed, subprocess.TimeoutExpired) as error:
                failed.append(f"{framework.label}: {' '.join(str(error).split())[:300]}")
    if failed:
        raise SetupError("; ".join(failed))


GROUPS: dict[str, tuple[Callable[[Reporter], None], ...]] = {
    "core": (core_runtimes,),
    "web": (npm_packages, python_playwright, chromium),
    "tflite": (litert_runtime, onnx2tf_environment),
    "coreml": (coreml_environment,),
    "frameworks": (framework_environments,),
}
OPT_IN = ("frameworks",)  # large (torch, TensorFlow, JAX layers): never part of `all` or `make setup`


def setup(groups: list[str], console: Console, verbosity: int) -> bool:
    """Run every step of the groups ("all" = each of them); False if a step failed (the others still ran)."""
    names = [g for g in GROUPS if g not in OPT_IN] if "all" in groups else list(dict.fromkeys(groups))
    report, ok = Reporter(console, verbosity), True
    for name in names:
        for step in GROUPS[name]:
            try:
                step(report)
            except (SetupError, OSError) as error:
                print(f"policy-matrix: setup {name} failed: {error}", file=sys.stderr)  # shown even with -q
                ok = False
    return ok


def _requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
