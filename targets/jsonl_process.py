"""A helper process spoken to with one JSON line each way: the client both ort-node and Core ML use.

The child reads one request per stdin line ({"op": ..., ...}) and answers each
with one stdout line, {"ok": true, "result": ...} or {"ok": false, "error": the
runtime's own words}. Its stderr goes to a log file (ORT's placement log for
ort-node; whatever a library prints) that the owner may read, and whose tail
explains a child that died. Closing stdin is the child's signal to exit.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

LOG_TAIL_CHARS = 2000  # enough for a stack trace's last frames and the error


class JsonLinesProcess:
    def __init__(self, command: list[str], name: str, env: dict[str, str] | None = None):
        self.name = name  # who the child is, in error messages
        self.stderr = tempfile.NamedTemporaryFile(prefix="policy-matrix-helper-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, bufsize=1, env=env)

    def call(self, op: str, **request: Any) -> Any:
        """Send one request and return its result; the child's error is raised as a RuntimeError."""
        self.process.stdin.write(json.dumps({"op": op, **request}) + "\n")
        self.process.stdin.flush()
        return self.reply()

    def reply(self) -> Any:
        """The next answer (also how an owner waits for a child that announces it is ready)."""
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited (code {self.process.wait()}): {self.log()[-LOG_TAIL_CHARS:].strip() or 'no output'}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(answer["error"])
        return answer["result"]

    def log(self) -> str:
        """What the child wrote on stderr so far."""
        return Path(self.stderr.name).read_text(errors="replace")

    def close(self, timeout_s: float = 10) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # end of input: the child finishes and exits
                self.process.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.stderr.close()
