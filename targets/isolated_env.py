"""Virtual environments for targets whose dependencies clash with the core.

onnx2tf pins old onnx/numpy/protobuf, so it cannot share the core's
environment. Such a target names a pinned requirements file; the environment
is built on first use under the cache directory, keyed by that file's content
hash and the interpreter that builds it (editing the pins, or a runner image
with another Python, builds a fresh one), and reused after that. Work crosses
the boundary the same way as every cell: files in, JSON out.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

from .base import signal_name
from .build_once import exclusive
from .paths import cache_dir


class EnvError(RuntimeError):
    pass


@dataclass(frozen=True)
class PinnedWheel:
    """A requirement that must come from one place, installed before the rest.

    PyPI's Linux torch wheel is the CUDA build (several GB of nvidia-* packages);
    the CPU build lives on PyTorch's own index. A wheel already on this machine
    (pip's find-links) is used first, so an offline mirror never asks that index.
    """

    requirement: str  # e.g. "torch==2.13.0+cpu"
    index_url: str


def env_dir(name: str, requirements: Path) -> Path:
    """The environment's folder: one per pin set and building interpreter.

    A venv links to the Python that made it: one cached from another Python (a runner
    image update, another setup-python version) is dead even though it looks complete.
    """
    digest = hashlib.sha256()
    for part in (requirements.read_bytes(), sys.version.encode(), str(Path(sys._base_executable).resolve()).encode()):
        digest.update(hashlib.sha256(part).digest())
    return cache_dir() / "envs" / f"{name}-py{sys.version_info[0]}{sys.version_info[1]}-{digest.hexdigest()[:12]}"


def _usable(directory: Path) -> bool:
    """Built to the end, and the base Python it runs on (pyvenv.cfg's `home`) still exists."""
    if not ((directory / ".complete").exists() and (directory / "bin" / "python").exists()):
        return False
    config = (directory / "pyvenv.cfg").read_text().splitlines()
    home = next((line.split("=", 1)[1].strip() for line in config if line.split("=", 1)[0].strip() == "home"), "")
    return bool(home) and Path(home).is_dir()


def env_python(name: str, requirements: Path) -> Path | None:
    """The environment's interpreter if it is already built and usable, else None."""
    directory = env_dir(name, requirements)
    return directory / "bin" / "python" if _usable(directory) else None


def ensure_env(name: str, requirements: Path, timeout_s: float = 1800, first: tuple[PinnedWheel, ...] = ()) -> Path:
    """Build (once, under the cache's lock) and return the interpreter of the named environment.

    An environment whose interpreter is gone is rebuilt rather than trusted. Unlike the
    other cache entries (build_once), a venv cannot be built aside and renamed into place
    (its scripts name the folder it was made in), so it is built where it lives and
    `.complete`, written last, says it is whole.
    """
    directory = env_dir(name, requirements)
    with exclusive(directory):
        if not _usable(directory):
            _build(directory, requirements, timeout_s, first)
    return directory / "bin" / "python"


def _build(directory: Path, requirements: Path, timeout_s: float, first: tuple[PinnedWheel, ...]) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    venv.EnvBuilder(with_pip=False).create(directory)
    pip = pip_install(directory / "bin" / "python")
    for wheel in first:
        local = subprocess.run([*pip, "--no-deps", "--no-index", wheel.requirement], capture_output=True, text=True,
                               timeout=timeout_s, env=own_environment())
        if local.returncode != 0:
            _pip(directory, [*pip, "--no-deps", "--index-url", wheel.index_url, wheel.requirement], timeout_s)
    _pip(directory, [*pip, "-r", str(requirements)], timeout_s)
    (directory / ".complete").write_text(sys.version)


def pip_install(python: Path) -> list[str]:
    """`pip install` into `python`'s environment, made without pip of its own: ensurepip installs and byte-compiles
    its bundled pip, ~9 CPU s per environment, for a pip nothing runs afterwards. The project's own pip installs
    there (--python); run it with `own_environment()`."""
    return [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--disable-pip-version-check"]


def _pip(directory: Path, command: list[str], timeout_s: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=own_environment())
    if done.returncode != 0:
        raise EnvError(f"building the {directory.name} environment failed: {_last_line(done.stderr)}")


def run_json(python: Path, script: Path, request: dict, timeout_s: float) -> dict:
    """Run `python script request.json` in the environment and return the JSON it prints last."""
    request_file = Path(request["workdir"]) / f"{script.stem}-request.json"
    request_file.write_text(json.dumps(request))
    done = subprocess.run(
        [str(python), str(script), str(request_file)], capture_output=True, text=True, timeout=timeout_s,
        env=own_environment()
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode < 0:  # killed: its last words show only where it was (e.g. a half-done import)
        raise EnvError(f"{script.name} was killed by signal {-done.returncode} ({signal_name(-done.returncode)})")
    if done.returncode != 0 or not lines:
        raise EnvError(_last_line(done.stderr) or f"{script.name} exited with {done.returncode}")
    return json.loads(lines[-1])


def own_environment() -> dict[str, str]:
    """This process's environment without what would show the environment's interpreter the core's packages: pip
    would count them as installed (and leave them out), a script would import them."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
