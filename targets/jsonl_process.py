"""A helper process spoken to with one JSON line each way: the client both ort-node and Core ML use.

The child reads one request per stdin line ({"op": ..., ...}) and answers each
with one stdout line, {"ok": true, "result": ...} or {"ok": false, "error": the
runtime's own words}. Its stderr goes to a log file (ORT's placement log for
ort-node; whatever a library prints) that the owner may read, and whose tail
explains a child that died. Closing stdin is the child's signal to exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import Any

from .base import signal_name

LOG_TAIL_CHARS = 2000  # enough for a stack trace's last frames and the error
LAST_LINE_CHARS = 300


class JsonLinesProcess:
    def __init__(self, command: list[str], name: str, env: dict[str, str] | None = None):
        self.name = name  # who the child is, in error messages
        # An unnamed file (O_TMPFILE where the OS has it): a worker killed with its helper leaves no log behind.
        self.stderr = tempfile.TemporaryFile(prefix="policy-matrix-helper-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, bufsize=1, env=env)

    def call(self, op: str, **request: Any) -> Any:
        """Send one request and return its result; the child's error is raised as a RuntimeError."""
        try:
            self.process.stdin.write(json.dumps({"op": op, **request}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # the child is gone: say how it ended
            raise RuntimeError(self._ending()) from None
        return self.reply()

    def reply(self) -> Any:
        """The next answer (also how an owner waits for a child that announces it is ready)."""
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(self._ending())
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(answer["error"])
        return answer["result"]

    def _ending(self) -> str:
        """How the child ended: a signal is named as such (its log's last line would only show where it was);
        an exit gives the log's last line, the error."""
        code = self.process.wait()
        if code < 0:
            return f"{self.name} was killed by signal {-code} ({signal_name(-code)})"
        lines = [line.strip() for line in self.log()[-LOG_TAIL_CHARS:].splitlines() if line.strip()]
        return f"{self.name} exited with code {code}: {lines[-1][:LAST_LINE_CHARS] if lines else 'no output'}"

    def log(self) -> str:
        """What the child wrote on stderr so far (read at an offset: the child's writes go on where they were)."""
        descriptor = self.stderr.fileno()
        return os.pread(descriptor, os.fstat(descriptor).st_size, 0).decode(errors="replace")

    def close(self, timeout_s: float = 30) -> None:
        # 30 s: an interpreter holding torch/coremltools takes over 10 s to exit on a loaded 2-core machine (CI
        # measured it); only a child that hangs after its input ended waits the whole grace before it is killed.
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # end of input: the child finishes and exits
                self.process.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.stderr.close()
