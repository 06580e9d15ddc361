"""The JSON-lines client ort-node and the Core ML helper share (targets/jsonl_process.py), against a
real child process speaking the protocol: results, the child's own errors, a child that dies."""

from __future__ import annotations

import sys
import textwrap

import pytest

from targets.jsonl_process import JsonLinesProcess

# A child as runner.mjs and coreml_predict.py behave: one reply per request line, exits at end of input.
CHILD = textwrap.dedent("""
    import json, sys
    print(json.dumps({"ok": True, "result": {"ready": True}}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "die":
            print("native crash: out of memory", file=sys.stderr, flush=True)
            sys.exit(3)
        if request["op"] == "add":
            reply = {"ok": True, "result": request["a"] + request["b"]}
        else:
            reply = {"ok": False, "error": "no such op: " + request["op"]}
        print(json.dumps(reply), flush=True)
""")


@pytest.fixture
def child():
    process = JsonLinesProcess([sys.executable, "-c", CHILD], "the test child")
    yield process
    process.close()


def test_a_request_gets_its_result_after_the_ready_line(child):
    assert child.reply() == {"ready": True}
    assert child.call("add", a=2, b=3) == 5
    assert child.call("add", a=[1], b=[2]) == [1, 2]


def test_the_childs_error_is_raised_in_its_own_words_and_the_child_keeps_serving(child):
    child.reply()
    with pytest.raises(RuntimeError, match="^no such op: nope$"):
        child.call("nope")
    assert child.call("add", a=1, b=1) == 2


def test_a_child_that_dies_is_named_with_its_exit_code_and_last_words(child):
    child.reply()
    with pytest.raises(RuntimeError, match=r"^the test child exited with code 3: native crash: out of memory$"):
        child.call("die")


def test_a_killed_child_is_named_by_its_signal_not_its_last_log_line(child):
    """A killed helper's log ends wherever it was (a 2,000-character ORT log tail, a half-imported module):
    the signal is what ended it."""
    import signal

    child.reply()
    child.process.send_signal(signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"^the test child was killed by signal 9 \(SIGKILL\)$"):
        child.call("add", a=1, b=1)


def test_a_helper_log_has_no_name_to_leave_behind(child):
    import os

    child.reply()
    assert os.readlink(f"/proc/self/fd/{child.stderr.fileno()}").endswith("(deleted)") or sys.platform != "linux"


def test_closing_ends_the_child_at_the_end_of_its_input(child):
    child.reply()
    child.close()
    assert child.process.returncode == 0
