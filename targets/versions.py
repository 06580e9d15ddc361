"""A runtime's release as an evaluation variable: `ort-cpu@1.20.1` runs another onnxruntime beside the default.

A pinned target is the same target class under the label `NAME@VERSION`; the label is the
cell's target everywhere (grid, tables, results.json), and the cell keeps the exact version
string the runtime reports. No suffix means the project's pinned default.

Where the release comes from (measured on Linux x86_64, Python 3.11):
- Python runtimes (onnxruntime, tract, ai-edge-litert): `pip install --no-deps --target DIR PACKAGE==VERSION`,
  put first on the cell worker's PYTHONPATH. The worker is the same `matrix.run.worker --serve` in
  the project's venv, so --timeout and the memory cap cover it alike, and everything else
  (numpy, onnx) stays the project's. An overlay, not a venv: onnxruntime 1.20.1 imports beside
  numpy 2 (its wheel is 42 MB; a full venv with numpy, onnx and protobuf would copy ~150 MB per
  release for nothing).
- onnxruntime-web / -node: `npm install --prefix DIR PACKAGE@VERSION`; the worker's harness
  serves (or requires) that DIR's node_modules instead of the harness's own.
Each lives once under the cache directory (runtimes/pip/..., runtimes/npm/...), built under
isolated_env's lock and swapped in whole. A release that cannot be installed is a SKIP with the
installer's own words; the worker checks that it really loaded the pinned release (a mismatch is
the tool's problem, reported as a SKIP, never a silent run of the default).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .base import CellSkip, Target
from .build_once import build_once
from .paths import cache_dir

SEPARATOR = "@"
PINNED_ENV = "POLICY_MATRIX_PINNED"  # the label whose environment a worker was started in
NODE_MODULES_ENV = "POLICY_MATRIX_NODE_MODULES"  # the pinned npm release's node_modules (web_support reads it)
# X.Y.Z, then only letters, digits and . - + (PEP 440 and semver, e.g. 1.22.0-dev.20250409-89f8206ba4):
# the version becomes part of a folder name and an installer argument, so nothing else gets through; and a
# shorter one (1.22) is a range to npm, not one release.
_VERSION = re.compile(r"^\d+\.\d+\.\d+([-+.]?[0-9A-Za-z]+)*$", re.ASCII)  # pip reads ASCII digits only
INSTALL_TIMEOUT_S = 900
REGISTRY_ANSWER_S = 600  # how long pip's list of a package's releases is reused: new releases are rare


class BadRelease(ValueError):
    """A label names no release this target can run (malformed, or a target without releases): the user's
    input, which the command line reports as bad input (matrix.cli.cli)."""


class VersionUnavailable(CellSkip):
    """The release cannot be installed here: the installer's words are the cell's SKIP reason."""


def check_version(label: str) -> str:
    """The version part of `label` (BadRelease when it is not a release number)."""
    version = label.partition(SEPARATOR)[2]
    if len(version) > 64 or not _VERSION.match(version):
        raise BadRelease(f"--targets {label!r}: {version!r} is not a release number (expected NAME@X.Y.Z, e.g. ort-cpu@1.20.1)")
    return version


# --- where a release comes from ----------------------------------------------------


def _meaningful_line(text: str, noise: tuple[str, ...] = (), first: bool = False) -> str:
    """The installer's reason: pip says it last, npm first (before its advice and the log's path)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not any(n in line for n in noise)]
    return (lines[0] if first else lines[-1]) if lines else ""


@dataclass(frozen=True)
class Release:
    """Where a target's runtime comes from, per release. `floor`: the oldest release the target's code works with."""

    package: str
    floor: str
    why_floor: str

    def installed(self, version: str) -> bool:
        """The release is in the cache, whole (build_once renames a finished folder into place; a lock is a file)."""
        return self.directory(version).is_dir()

    def install(self, version: str) -> Path:
        """The release's folder, installed once (build_once: under a lock, swapped in whole). The lock lives in
        `.locks`, so a failed install leaves nothing beside the releases: no lock, no half-made folder."""
        directory = self.directory(version)
        build_once(directory, functools.partial(self._install, version), lock=directory.parent / ".locks" / f"{directory.name}.lock")
        return directory


@dataclass(frozen=True)
class PipRelease(Release):
    """A Python runtime as a wheel overlay."""

    def directory(self, version: str) -> Path:
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return cache_dir() / "runtimes" / "pip" / f"{self.package}-{version}-py{sys.version_info[0]}{sys.version_info[1]}-{platform}"

    def _install(self, version: str, into: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                               "--only-binary=:all:", "--target", str(into), f"{self.package}=={version}"],
                              capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            raise VersionUnavailable(f"pip cannot install {self.package}=={version} here: "
                                     f"{_meaningful_line(done.stderr, ('WARNING', 'notice')) or 'no reason given'}")

    def worker_env(self, directory: Path) -> dict[str, str]:
        paths = [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {"PYTHONPATH": os.pathsep.join(paths)}

    def loaded_version(self) -> str:
        return importlib.metadata.version(self.package)

    def same_release(self, loaded: str, wanted: str) -> bool:
        """PEP 440 equality: pip installs 1.22.0rc1 for 1.22.0-rc1."""
        try:
            return Version(loaded) == Version(wanted)
        except InvalidVersion:
            return loaded == wanted

    def registry_versions(self) -> list[str]:
        """pip's answer, reused for REGISTRY_ANSWER_S under the same pip configuration: a bisect, the next bisect
        and `targets --versions` ask once (each `pip index versions` takes seconds). No answer is not kept."""
        answer = cache_dir() / "runtimes" / "pip-index" / f"{self.package}-{_pip_configuration()}.json"
        with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: ask pip
            if time.time() - answer.stat().st_mtime < REGISTRY_ANSWER_S:
                return json.loads(answer.read_text())
        done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", self.package, "--disable-pip-version-check"],
                              capture_output=True, text=True, timeout=120)
        found = re.search(r"Available versions: (.*)", done.stdout)
        if not found:
            raise RuntimeError(f"pip index versions {self.package}: {_meaningful_line(done.stderr) or 'no answer'}")
        offered = [v.strip() for v in found.group(1).split(",")]
        answer.parent.mkdir(parents=True, exist_ok=True)
        staging = answer.with_name(f"{answer.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(offered))
        os.replace(staging, answer)  # whole: a concurrent reader sees this answer or none
        return offered


def _pip_configuration() -> str:
    """What decides pip's index (its PIP_* variables and configuration files, pip itself): another configuration
    asks again. The files are those pip reads on Linux and macOS (`pip config debug`)."""
    home = Path.home()
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    config_dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [*(Path(folder) / "pip" / "pip.conf" for folder in config_dirs), Path("/etc/pip.conf"),
             home / ".pip" / "pip.conf", config_home / "pip" / "pip.conf", Path(sys.prefix) / "pip.conf",
             Path(os.environ.get("PIP_CONFIG_FILE") or os.devnull)]
    words = [sys.executable, *sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("PIP_"))]
    digest = hashlib.sha256("\0".join(words).encode())
    for file in files:
        digest.update(str(file).encode() + (file.read_bytes() if file.is_file() else b"(none)"))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class NpmRelease(Release):
    """An npm package (onnxruntime-web, -node) installed into its own folder per release."""

    def directory(self, version: str) -> Path:
        return cache_dir() / "runtimes" / "npm" / f"{self.package}-{version}"

    def _install(self, version: str, into: Path) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise VersionUnavailable("npm is not installed: pinned onnxruntime-web/-node releases need it")
        # the package's install script only fetches optional CUDA files (onnxruntime-node): never needed here
        environment = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"}
        done = subprocess.run([npm, "install", "--prefix", str(into), "--no-save", "--no-audit", "--no-fund",
                               "--ignore-scripts", "--loglevel=error", f"{self.package}@{version}"],
                              capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=environment)
        if done.returncode != 0:
            words = _meaningful_line(done.stderr, ("npm error code", "npm ERR! code"), first=True)
            raise VersionUnavailable(f"npm cannot install {self.package}@{version} here: {words or 'no reason given'}")

    def worker_env(self, directory: Path) -> dict[str, str]:
        return {NODE_MODULES_ENV: str(directory / "node_modules")}

    def loaded_version(self) -> str:
        manifest = Path(os.environ.get(NODE_MODULES_ENV, "")) / self.package / "package.json"
        return json.loads(manifest.read_text())["version"] if manifest.is_file() else "(none)"

    def same_release(self, loaded: str, wanted: str) -> bool:
        return loaded == wanted

    def registry_versions(self) -> list[str]:
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed")
        done = subprocess.run([npm, "view", self.package, "versions", "--json"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"npm view {self.package}: {_meaningful_line(done.stderr) or 'no answer'}")
        return json.loads(done.stdout)


def release_of(target: Target) -> PipRelease | NpmRelease | None:
    """How a target's runtime is installed per release (the target's own `release`), None when it cannot be pinned."""
    return getattr(type(target), "release", None)


# --- the pinned target -----------------------------------------------------------


def pinned(base: Target, label: str) -> Target:
    """`base` under the label NAME@VERSION (BadRelease if it cannot be pinned or the version is malformed)."""
    version = check_version(label)
    if release_of(base) is None:
        pinnable = ", ".join(name for name, t in _registry().items() if release_of(t) is not None)
        raise BadRelease(f"--targets {label!r}: {base.name} cannot be pinned to a release (these can: {pinnable})")
    target = copy.copy(base)
    target.name = label  # the instance's name shadows the class's: cells, tables and results carry the label
    target.pinned_version = version
    if os.environ.get(PINNED_ENV) != label:  # outside its worker only the request is known
        target.runtime_version = lambda: f"{release_of(base).package} {version} (requested)"
    return target


def _registry() -> dict[str, Target]:
    from . import REGISTRY

    return REGISTRY


def is_pinned(target: Target) -> bool:
    return bool(getattr(target, "pinned_version", ""))


_INSTALL_FAILED: dict[str, str] = {}  # label -> the installer's words, so a run asks the registry once per release


def install_problem(target: Target) -> str | None:
    """None when the target's pinned release is installed (installing it now if needed), else why not."""
    if not is_pinned(target):
        return None
    release = release_of(target)
    if below_floor(target):
        return (f"not run: {target.name} is older than the harness supports "
                f"({release.package} >= {release.floor}: {release.why_floor})")
    if target.name not in _INSTALL_FAILED:
        try:
            worker_env(target)
        except VersionUnavailable as unavailable:
            _INSTALL_FAILED[target.name] = str(unavailable)
        except (OSError, subprocess.SubprocessError) as error:  # e.g. the installer timed out or the cache is read-only
            _INSTALL_FAILED[target.name] = f"installing {target.name} failed: {error}"
        else:
            return None
    return _INSTALL_FAILED[target.name]


def below_floor(target: Target) -> bool:
    """The pinned release is older than the harness supports (never installed: install_problem says why)."""
    return _release_key(target.pinned_version) < _release_key(release_of(target).floor)


def worker_env(target: Target) -> dict[str, str]:
    """The environment a pinned target's worker needs ({} for a default one); installs the release on first use."""
    if not is_pinned(target):
        return {}
    release = release_of(target)
    directory = release.install(target.pinned_version)
    return {**release.worker_env(directory), PINNED_ENV: target.name}


def check_loaded(target: Target) -> None:
    """In the worker: the runtime it imported is the pinned release, or the cell is a SKIP saying so."""
    if not is_pinned(target):
        return
    release = release_of(target)
    try:
        loaded = release.loaded_version()
    except importlib.metadata.PackageNotFoundError:
        loaded = "(none)"
    if os.environ.get(PINNED_ENV) != target.name or not release.same_release(loaded, target.pinned_version):
        raise CellSkip(f"not run: the tool's problem: the worker for {target.name} loaded {release.package} {loaded}, "
                       f"not {target.pinned_version}")


# --- what the registry offers ------------------------------------------------------


def _release_key(version: str) -> tuple:
    numbers = re.match(r"\d+(\.\d+)*", version).group(0)
    return tuple(int(part) for part in numbers.split("."))


def supported_versions(target: Target) -> list[str]:
    """Releases the registry offers at or above the target's floor, oldest first (pre-releases left out)."""
    release = release_of(target)
    if release is None:
        raise BadRelease(f"{target.name} cannot be pinned to a release")
    offered = [v for v in release.registry_versions() if re.fullmatch(r"\d+(\.\d+)+", v)]
    return sorted((v for v in offered if _release_key(v) >= _release_key(release.floor)), key=_release_key)
