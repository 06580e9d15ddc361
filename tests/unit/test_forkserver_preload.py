"""The fork server imports between requests (matrix/run/forkserver.py): a child may be forked after any import
step, so after every step the server must be in a state a child can start from, and the steps must load what
the jobs need."""

from __future__ import annotations

import json
import subprocess
import sys

from matrix.run import forkserver


def test_no_step_leaves_an_entry_module_imported_and_the_steps_load_what_jobs_need():
    # An entry module left in sys.modules makes runpy warn and run a second copy of it as the child's __main__;
    # the reference job imports matrix.run.guarded, another entry module, while its own step runs.
    probe = ("import json, sys\nfrom matrix.run import forkserver\nleft = []\n"
             "for step in forkserver.preload_steps():\n"
             "    step()\n"
             "    left += [name for name in forkserver.ENTRY_MODULES if name in sys.modules]\n"
             "print(json.dumps({'left': left, 'loaded': sorted(sys.modules)}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["left"] == []
    wanted = {*forkserver.PRELOAD, "matrix.results", "matrix.inputs.model", "targets"}
    assert wanted <= set(found["loaded"]), wanted - set(found["loaded"])
