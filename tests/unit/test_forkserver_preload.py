"""The fork server imports between requests (matrix/run/forkserver.py): a child may be forked after any import
step, so after every step the server must be in a state a child can start from, and the steps must load what
the jobs need."""

from __future__ import annotations

import json
import subprocess
import sys

from matrix.run import forkserver


def _last_line(probe: str) -> str:
    """The last line a fresh interpreter running `probe` prints: imports must start from nothing loaded."""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    return done.stdout.strip().splitlines()[-1]


def test_no_step_leaves_an_entry_module_imported_and_the_steps_load_what_jobs_need():
    # An entry module left in sys.modules makes runpy warn and run a second copy of it as the child's __main__;
    # the reference job imports matrix.run.guarded, another entry module, while its own step runs.
    probe = ("import json, sys\nfrom matrix.run import forkserver\nleft = []\n"
             "for step in forkserver.preload_steps():\n"
             "    step()\n"
             "    left += [name for name in forkserver.ENTRY_MODULES if name in sys.modules]\n"
             "print(json.dumps({'left': left, 'loaded': sorted(sys.modules)}))")
    found = json.loads(_last_line(probe))
    assert found["left"] == []
    wanted = {*forkserver.PRELOAD, "matrix.results", "matrix.inputs.model", "targets"}
    assert wanted <= set(found["loaded"]), wanted - set(found["loaded"])


def test_collection_paused_for_the_imports_resumes_with_them_frozen_and_never_where_it_was_not_paused():
    # The runner and the server pause cyclic collection while importing; a process that never paused (a test
    # running the command line in its own process) must not have its garbage frozen by a run's resume.
    probe = ("import gc, json\nfrom matrix.run import forkserver\n"
             "forkserver.resume_collection()\nnot_paused = [gc.isenabled(), gc.get_freeze_count()]\n"
             "forkserver.pause_collection()\npaused = gc.isenabled()\nimport matrix.results\n"
             "forkserver.resume_collection()\n"
             "print(json.dumps({'not_paused': not_paused, 'paused': paused, 'resumed': gc.isenabled(), "
             "'frozen': gc.get_freeze_count()}))")
    found = json.loads(_last_line(probe))
    assert found["not_paused"] == [True, 0]
    assert found["paused"] is False and found["resumed"] is True
    assert found["frozen"] > 10_000  # the imported modules' objects, out of every later collection's way


def test_the_reference_job_does_without_pydantic_and_the_results_schemas():
    # Forked before the server has imported them (a run asks for its reference early), it would import them itself;
    # a reference that drives no rollout (no --env, no --trajectory) needs neither.
    probe = ("import sys\nimport matrix.run.guarded, matrix.reference.reference_job\n"
             "print(sorted({'pydantic', 'matrix.results', 'matrix.run.rollouts'} & set(sys.modules)))")
    assert _last_line(probe) == "[]"


def test_the_steps_leave_onnx_references_operators_found_for_every_job_forked_after_them():
    # Found by a process's first evaluator otherwise: ~20 ms of each reference job's, a third of the MLP's.
    probe = ("from matrix.run import forkserver\n"
             "for step in forkserver.preload_steps():\n"
             "    step()\n"
             "from onnx.reference.ops import _op_list\n"
             "print(_op_list._registered_operators is not None)")
    assert _last_line(probe) == "True"


def test_a_childs_end_is_told_while_an_import_step_is_still_running():
    # A run's reference job ends while the server imports the workers' modules: its status must not wait for the
    # step (the runner waited 5-10 ms for each). The step here lasts until the probe ends it, after the status came.
    probe = (
        "import json, os, select, socket\n"
        "from matrix.run import forkserver\n"
        "ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "entered_r, entered_w = os.pipe()\ngo_r, go_w = os.pipe()\n"
        "def step():\n    os.write(entered_w, b'1')\n    os.read(go_r, 1)\n"
        "stdin_r, stdin_w = os.pipe()\ndevnull = os.open(os.devnull, os.O_RDWR)\n"
        "channel, their_channel = socket.socketpair()\n"
        "request = {'argv': ['json.tool'], 'env': dict(os.environ), 'cwd': os.getcwd(), 'memory_limit': None,"
        " 'death_signal': False}\n"
        "# asked before the server starts: it serves the request first, then enters its step\n"
        "socket.send_fds(ours, [json.dumps(request).encode()], [their_channel.fileno(), stdin_r, devnull, devnull])\n"
        "if os.fork() == 0:\n"
        "    for end in (ours, channel, their_channel):\n        end.close()\n"
        "    for fd in (stdin_r, stdin_w, devnull):\n        os.close(fd)\n"
        "    forkserver.serve(theirs, [step])\n    os._exit(0)\n"
        "for end in (theirs, their_channel):\n    end.close()\n"
        "os.close(stdin_r)\n"
        "assert ours.recv(16) == forkserver.READY\n"
        "pid_line = channel.recv(64)\n"
        "assert os.read(entered_r, 1) == b'1'  # the server is inside its import step now\n"
        "os.write(stdin_w, b'{}'); os.close(stdin_w)  # the child reads its input and ends\n"
        "status = b''\n"
        "while b'\\n' not in status and select.select([channel], [], [], 60)[0]:\n"
        "    status += channel.recv(64)\n"
        "os.write(go_w, b'1')\n"
        "print(json.dumps({'status': status.decode()}))")
    assert json.loads(_last_line(probe)) == {"status": "0\n"}
