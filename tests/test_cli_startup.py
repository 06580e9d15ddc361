"""The CLI starts about as fast as Python with numpy: `--version`/`--help` import nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cli_startup  # noqa: E402

pytestmark = [pytest.mark.slow]

HEAVY = ("numpy", "pandas", "matplotlib", "onnx", "onnxruntime", "pydantic", "jinja2", "targets", "rich")


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_nothing_heavy(flag):
    probe = ("import sys; sys.argv = ['policy-matrix', %r]\n"
             "from matrix.cli.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "import json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))") % flag
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_startup_within_twice_numpy_import():
    found = cli_startup.startup(rounds=5)
    numpy_s = found["python -c 'import numpy'"]
    assert found["policy-matrix --version"] <= 2 * numpy_s
    assert found["policy-matrix --help"] <= 2 * numpy_s


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_runs_help_imports_none_of_what_a_runs_fork_server_is_forked_after(flag):
    # The program itself (python -m matrix), where a run forks its server once numpy, onnx and pydantic are loaded.
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "matrix", "run", flag], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    # By package: a module imported through importlib.import_module has no line of its own, only its submodules
    imported = {line.split("|")[2].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert not imported & {"numpy", "onnx", "pydantic"}, imported & {"numpy", "onnx", "pydantic"}


@pytest.mark.parametrize("given, expected", [(None, "4"), ("16", "16")])
def test_the_program_lets_numpys_blas_threads_sleep_when_idle(given, expected):
    # Set before anything imports numpy, so every process of a run inherits it; a value the user set stays.
    probe = ("import os, sys; sys.argv = ['policy-matrix', '--version']\n"
             "from matrix.cli import main\n"
             "try:\n    main()\n"
             "finally:\n    print('blas', os.environ.get('OPENBLAS_THREAD_TIMEOUT'), file=sys.stderr, flush=True)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"blas {expected}" in done.stderr.splitlines()


def test_a_run_asks_for_its_reference_job_before_importing_what_it_needs_later(tmp_path):
    # The reference job runs while the runner imports the console (rich) and the report (Jinja2), not after them;
    # -q's console prints nothing and loads no rich console at all; the run's folder lock is flock(2) itself, not
    # filelock (~6 ms of imports for one call).
    model = Path(__file__).resolve().parent.parent / "matrix" / "example_policies" / "continuous_mlp.onnx"
    probe = ("import json, sys\n"
             f"sys.argv = ['policy-matrix', '-q', 'run', {str(model)!r}, '--targets', 'ort-cpu', '--variants', 'fp32',"
             f" '--out', {str(tmp_path / 'report')!r}, '--fail-on', 'never']\n"
             "from matrix.run import forkserver\n"
             "loaded = {}\n"
             "start = forkserver.Client.start\n"
             "def start_noting_imports(self, command, **options):\n"
             "    loaded.setdefault(' '.join(command[2:4]), sorted(sys.modules))\n"
             "    return start(self, command, **options)\n"
             "forkserver.Client.start = start_noting_imports\n"
             "from matrix.cli import main\n"
             "try:\n    main()\n"
             "finally:\n    print(json.dumps(loaded), file=sys.stderr, flush=True)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert not {"rich", "jinja2", "filelock"} & {name.split(".")[0] for name in loaded["matrix.run.guarded reference"]}
    assert "rich.console" not in loaded["matrix.run.worker --serve"]
    assert (tmp_path / "report" / "index.html").exists()
