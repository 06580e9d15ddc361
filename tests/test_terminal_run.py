"""A run on a terminal: rich's live display draws the cells' progress bars, and the run still ends with its report."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading

import pytest

from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.slow]

ANSI_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_a_run_on_a_terminal_draws_its_progress_bars_and_writes_its_report(tmp_path):
    # Only a terminal makes rich draw its live display, which enters the console it is handed (`with console:`):
    # every other test runs the CLI on pipes, where that path never runs.
    leader, follower = pty.openpty()
    shown: list[bytes] = []
    reader = threading.Thread(target=_read_until_closed, args=(leader, shown), daemon=True)
    reader.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "matrix", "run", str(example("continuous_mlp")), "--targets", "ort-cpu",
             "--variants", "fp32", "--out", str(tmp_path / "report")],
            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, timeout=300,
            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"})
    finally:
        os.close(follower)
    reader.join(timeout=30)
    text = ANSI_CONTROL.sub("", b"".join(shown).decode(errors="replace"))
    assert done.returncode == 0, text[-2000:]
    assert "━" in text, text[-2000:]  # the progress bar, drawn because this is a terminal
    assert "PASS 1 WARN 0 FAIL 0" in text, text[-2000:]
    assert (tmp_path / "report" / "index.html").is_file()


def _read_until_closed(fd: int, into: list[bytes]) -> None:
    """Everything written to the terminal, read as it comes (a full terminal buffer would block the run)."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the last writer closed its end
            break
        if not chunk:
            break
        into.append(chunk)
    os.close(fd)
