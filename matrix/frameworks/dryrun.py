"""The dry-run: per framework and policy, build, train and export in the framework's environment,
then run the matrix on the export through the CLI (`policy-matrix run` with `--env`, `--source`
and `--assist`, one subprocess per policy, its own report folder), and read one row of the table
from what that run wrote. A finished build is cached by its recipe (`build_key`) and copied, saying so, into
a later table's folder; the cache keeps one build per framework release and policy (the latest built). Nothing is assumed: a framework that did not install, a policy that did
not build and a run that did not finish are rows that say so in the tool's or pip's own words.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from targets.build_once import build_once, exclusive
from targets.paths import cache_dir

from . import KIT, Framework, environments
from .rows import Row, framework_row, policy_row

BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 3600
DEFAULT_TARGETS = "ort-cpu,ort-node,ort-web-wasm,ort-web-webgl,ort-web-webgpu,tract,tflite,coreml"
MANIFEST = "manifest.json"  # what a build leaves (_kit.py writes it last)
BUILDS = "framework-builds"  # finished builds in the cache: `<framework>-<release>-<policy>-<build_key>` folders


class PolicyBuildFailed(RuntimeError):
    """A policy's training or export did not finish: its last words."""


@dataclass
class Plan:
    out: Path
    targets: str = DEFAULT_TARGETS
    variants: str = "fp32"
    episodes: int = 3
    seed: int = 0
    iters: int = 50
    jobs: int = 1  # policies built and run at a time
    rebuild: bool = False  # train and export again even where a policy folder or the cache holds a finished build


def interpreter(framework: Framework, on_progress) -> tuple[Path | None, str]:
    """The framework's python, building its environment where nothing was tried yet; else why not."""
    built = environments.python(framework)
    if built is not None:
        return built, ""
    recorded = environments.failure(framework)
    if recorded is not None:
        return None, f"pip install failed (run `policy-matrix setup frameworks` to retry): {recorded}"
    on_progress(f"{framework.label}: building its environment once ({', '.join(framework.pins()) or 'base only'})")
    try:
        return environments.ensure(framework), ""
    except environments.BuildFailed as error:
        return None, f"pip install failed: {error}"
    except subprocess.TimeoutExpired:
        return None, f"pip install ran past {environments.INSTALL_TIMEOUT_S} s"


def policy_folder(plan: Plan, framework: Framework, policy: str) -> Path:
    return plan.out / f"{framework.name}-{framework.version or 'base'}" / policy


def build(python: Path, framework: Framework, policy: str, folder: Path, seed: int, rebuild: bool = False) -> str:
    """Train and export in the framework's interpreter, once per recipe: a finished build with the same key
    (`build_key`) is copied from the cache, and its manifest says so. "" when the folder holds a build, else the
    build's last words (a failed build is not cached: the next run tries again)."""
    if not rebuild and finished(folder):
        return ""
    entry = cache_dir() / BUILDS / f"{_builds_of(framework, policy)}-{build_key(python, framework, policy, seed)}"
    try:
        while not build_once(entry, lambda staging: _train_and_export(python, framework, policy, folder, seed, staging),
                             ready=lambda place: not rebuild and finished(place)):
            if _restore(entry, folder):
                return ""
            # else another recipe's run evicted the entry after this one found it: build it here after all
    except PolicyBuildFailed as failed:
        return str(failed)
    _evict_older_builds(entry, framework, policy)
    return ""


def _builds_of(framework: Framework, policy: str) -> str:
    """What the cache's entries of one framework release's policy start with: one kept, the latest built
    (the release is in it so that two releases compared in one table do not evict each other's build)."""
    return f"{framework.name}-{framework.version or 'base'}-{policy}"


def _evict_older_builds(entry: Path, framework: Framework, policy: str) -> None:
    """Remove the policy's other builds (an older recipe: an edited module, other pins or seed), each under its
    lock and renamed away first, so a run copying one (`_restore`, under that lock) finishes its copy first."""
    older = re.compile(re.escape(_builds_of(framework, policy)) + r"-[0-9a-f]{16}")
    for other in entry.parent.iterdir():
        if other != entry and older.fullmatch(other.name):
            gone = other.with_name(f"{other.name}.{uuid.uuid4().hex[:8]}.evicted")
            with exclusive(other), contextlib.suppress(FileNotFoundError):  # another run evicted it meanwhile
                os.replace(other, gone)
            shutil.rmtree(gone, ignore_errors=True)


def build_key(python: Path, framework: Framework, policy: str, seed: int) -> str:
    """Everything that makes the export: the framework module, the kit and this driver (their bytes), the pins,
    the interpreter (its environment's folder is keyed by the pins, the base and the Python), the policy and seed."""
    recipe = [path.read_bytes() for path in (framework.file, KIT, Path(__file__))]
    words = [*framework.pins(), str(python), policy, str(seed)]
    return hashlib.sha256(b"\0".join([*recipe, *(word.encode() for word in words)])).hexdigest()[:16]


def finished(folder: Path) -> bool:
    return (folder / MANIFEST).exists() and (folder / "policy.onnx").exists()


def _train_and_export(python: Path, framework: Framework, policy: str, folder: Path, seed: int, staging: Path) -> None:
    """The build in the policy's folder (its build.log stays there either way); the finished folder is copied to
    `staging`, which becomes the cache entry."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for script in (framework.file, KIT):
        shutil.copy2(script, folder / script.name)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    command = [str(python), framework.file.name, "build", policy, ".", str(seed)]
    try:
        done = subprocess.run(command, cwd=folder, env={**clean, "PYTHONHASHSEED": "0"}, capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as late:
        (folder / "build.log").write_text(_text(late.stdout) + _text(late.stderr))
        raise PolicyBuildFailed(f"training and export ran past {BUILD_TIMEOUT_S} s") from None
    (folder / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not finished(folder):
        raise PolicyBuildFailed(_last_words(done.stderr) or f"exited with {done.returncode}")
    shutil.copytree(folder, staging)


def _restore(entry: Path, folder: Path) -> bool:
    """The cached build into the policy's folder, its manifest naming where it came from and when it was built;
    False when the entry is gone (evicted by a run of another recipe). Under the entry's lock: not evicted mid-copy."""
    with exclusive(entry):
        if not finished(entry):
            return False
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(entry, folder)
        built = datetime.fromtimestamp(entry.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["cached_build"] = f"cached build of {built} (same recipe, pins, interpreter and seed; --rebuild trains again)"
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return True


def run_matrix(python: Path, plan: Plan, manifest: dict, folder: Path) -> str:
    """`policy-matrix run` on the export, from the policy's folder (where --source finds its module);
    "" when it wrote results.json, else its last words. A finished run of this build is kept (--rebuild redoes both)."""
    if (folder / "report" / "results.json").exists():
        return ""
    command = [sys.executable, "-m", "matrix", "-q", "run", "policy.onnx", "--out", "report", "--fail-on", "never",
               "--targets", plan.targets, "--variants", plan.variants, "--seed", str(plan.seed), "--iters", str(plan.iters),
               "--warmup", str(min(plan.iters, 10)), "--batch-sizes", "1",
               "--env", manifest["task"], "--episodes", str(plan.episodes), "--assist"]
    if manifest.get("source"):
        command += ["--source", manifest["source"], "--source-python", str(python)]
    try:
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"policy-matrix run ran past {RUN_TIMEOUT_S} s"
    (folder / "run.log").write_text(done.stdout + done.stderr)
    if not (folder / "report" / "results.json").exists():
        return _last_words(done.stderr) or f"policy-matrix run exited with {done.returncode}"
    return ""


def dry_run(plan: Plan, frameworks: list[Framework], on_progress) -> list[Row]:
    """Rows in the order asked for; the policies' builds and runs (independent subprocesses) `plan.jobs` at a time."""
    slots: list[Row | Future] = []
    with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        for framework in frameworks:
            if framework.unavailable:
                slots.append(framework_row(framework, framework.unavailable))
                continue
            python, why = interpreter(framework, on_progress)
            if python is None:
                slots.append(framework_row(framework, why))
                continue
            slots += [pool.submit(_policy, plan, framework, python, policy, on_progress) for policy in framework.policies]
    return [slot.result() if isinstance(slot, Future) else slot for slot in slots]


def _policy(plan: Plan, framework: Framework, python: Path, policy: str, on_progress) -> Row:
    """One policy, under its folder's lock: two dry-runs sharing an --out build and run it once."""
    folder = policy_folder(plan, framework, policy)
    with exclusive(folder):
        on_progress(f"{framework.label} {policy}: train and export")
        failed = build(python, framework, policy, folder, plan.seed, plan.rebuild)
        if failed:
            return framework_row(framework, f"build failed: {failed}", policy=policy)
        manifest = json.loads((folder / MANIFEST).read_text())
        on_progress(f"{framework.label} {policy}: the matrix ({plan.targets})")
        failed = run_matrix(python, plan, manifest, folder)
    if failed:
        return framework_row(framework, f"policy-matrix run failed: {failed}", policy=policy, manifest=manifest)
    return policy_row(framework, manifest, folder, plan.out)


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _last_words(stderr: str, lines: int = 3) -> str:
    kept = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[:600]
