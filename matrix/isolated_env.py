"""Virtual environments for targets whose dependencies clash with the core.

onnx2tf pins old onnx/numpy/protobuf, so it cannot share the core's
environment. Such a target names a pinned requirements file; the environment
is built on first use under the cache directory, keyed by that file's content
hash (editing the pins builds a fresh one), and reused after that. Work crosses
the boundary the same way as every cell: files in, JSON out.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from .paths import cache_dir


class EnvError(RuntimeError):
    pass


def env_dir(name: str, requirements: Path) -> Path:
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    return cache_dir() / "envs" / f"{name}-{digest}"


def env_python(name: str, requirements: Path) -> Path | None:
    """The environment's interpreter if it is already built, else None."""
    python = env_dir(name, requirements) / "bin" / "python"
    return python if (env_dir(name, requirements) / ".complete").exists() else None


def ensure_env(name: str, requirements: Path, timeout_s: float = 1800) -> Path:
    """Build (once, under a lock) and return the interpreter of the named environment."""
    directory = env_dir(name, requirements)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / ".complete").exists():
            _build(directory, requirements, timeout_s)
    return directory / "bin" / "python"


def _build(directory: Path, requirements: Path, timeout_s: float) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    venv.EnvBuilder(with_pip=True).create(directory)
    python = directory / "bin" / "python"
    command = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(requirements)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise EnvError(f"building the {directory.name} environment failed: {_last_line(done.stderr)}")
    (directory / ".complete").write_text(sys.version)


def run_json(python: Path, script: Path, request: dict, timeout_s: float) -> dict:
    """Run `python script request.json` in the environment and return the JSON it prints last."""
    request_file = Path(request["workdir"]) / f"{script.stem}-request.json"
    request_file.write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(python), str(script), str(request_file)], capture_output=True, text=True, timeout=timeout_s, env=env
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise EnvError(_last_line(done.stderr) or f"{script.name} exited with {done.returncode}")
    return json.loads(lines[-1])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
