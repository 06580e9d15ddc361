"""Each framework's own pinned environment, built once in the cache like the converter environments.

Torch-based frameworks are layered over the Core ML environment's CPU torch and Keras over the
onnx2tf environment's TensorFlow: a venv whose site-packages holds a .pth line naming the base's,
so the base's packages are importable but never installed twice (pip installs only what the
framework adds, into the layer; a pin that differs from the base's shadows it there). JAX has
no base. The folder is keyed by the pins, the base's folder and the building Python, so another
release (`sb3@2.4.1`) is another environment. A build that fails leaves pip's own words in
`FAILED` beside it, which the table shows as the framework's row; `.complete` marks a whole one.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from targets import isolated_env
from targets.build_once import exclusive
from targets.paths import cache_dir

from . import Framework

INSTALL_TIMEOUT_S = 1800
FAILED = "FAILED"


class BuildFailed(RuntimeError):
    """pip's words (or the missing base) for a framework whose environment could not be built."""


def base_python(base: str | None, build: bool) -> Path | None:
    """The base environment's interpreter: built first when `build`, else None when it is not there."""
    from targets import coreml_conversion, tflite_conversion

    if base is None:
        return Path(sys.executable)
    owner = {"torch": coreml_conversion, "tensorflow": tflite_conversion}[base]
    python = isolated_env.env_python(owner.ENV_NAME, owner.REQUIREMENTS)
    if python is None and build:
        python = owner.build_environment()
    return python


def folder(framework: Framework, base: Path) -> Path:
    digest = hashlib.sha256("\n".join([*framework.pins(), str(base.resolve()), sys.version]).encode()).hexdigest()[:12]
    release = framework.version or "base"
    return cache_dir() / "envs" / f"framework-{framework.name}-{release}-{digest}"


def python(framework: Framework) -> Path | None:
    """The framework's interpreter if its environment is built, else None."""
    base = base_python(framework.base, build=False)
    if base is None:
        return None
    place = folder(framework, base)
    return place / "bin" / "python" if (place / ".complete").exists() else None


def failure(framework: Framework) -> str | None:
    """pip's words from the last failed build of this environment, if that is what is there."""
    base = base_python(framework.base, build=False)
    if base is None:
        return None
    recorded = folder(framework, base) / FAILED
    return recorded.read_text() if recorded.exists() else None


def ensure(framework: Framework) -> Path:
    """Build (once, under the cache's lock) and return the framework's interpreter; BuildFailed says why not."""
    base = base_python(framework.base, build=True)
    place = folder(framework, base)
    with exclusive(place):
        if not (place / ".complete").exists():
            _build(place, base, framework)
    return place / "bin" / "python"


def _build(place: Path, base: Path, framework: Framework) -> None:
    shutil.rmtree(place, ignore_errors=True)
    if framework.base is None:
        venv.EnvBuilder(with_pip=False).create(place)
    else:  # the base's own interpreter makes the layer, so the .pth names site-packages of the same Python
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(place)], check=True, capture_output=True,
                       timeout=300)
        base_site = _site_packages(base.parent.parent)
        _site_packages(place).joinpath("base-env.pth").write_text(f"{base_site}\n")
    pins = framework.pins()
    if pins:
        done = subprocess.run([*isolated_env.pip_install(place / "bin" / "python"), *pins], capture_output=True,
                              text=True, timeout=INSTALL_TIMEOUT_S, env=isolated_env.own_environment())
        if done.returncode != 0:
            words = _pip_words(done.stderr)
            (place / FAILED).write_text(words)
            raise BuildFailed(words)
    (place / ".complete").write_text(" ".join(pins))


def _site_packages(environment: Path) -> Path:
    return next((environment / "lib").glob("python3*/site-packages"))


def _pip_words(stderr: str) -> str:
    """pip's error lines (ERROR: ... and what follows), not its progress."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("ERROR")), max(len(lines) - 6, 0))
    return "\n".join(lines[start:start + 12]) or "pip failed without a message"
