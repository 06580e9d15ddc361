"""The Makefile's commands as the shell receives them: a path a user names is one argument, whatever it holds."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A `make` started inside `make test` would otherwise announce its directories.
PLAIN_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}


def _command(target: str, *variables: str, program: str) -> list[str]:
    """The words of `target`'s line running `program`, as `make -n` prints it for the shell (nothing is run)."""
    printed = subprocess.run(["make", "-n", target, *variables], cwd=REPO, capture_output=True, text=True, env=PLAIN_ENV,
                             check=True).stdout
    (line,) = [line for line in printed.splitlines() if f"policy-matrix {program}" in line]
    return shlex.split(line)


def test_a_model_path_with_a_space_or_a_quote_is_one_argument():
    """`make matrix MODEL='my policies/it's.onnx'` split the path into two arguments at the space."""
    words = _command("matrix", "MODEL=my policies/it's.onnx", "ARGS=--targets ort-cpu --variants fp32", program="run")
    assert words[1:] == ["run", "my policies/it's.onnx", "--fail-on", "never", "--targets", "ort-cpu", "--variants", "fp32"]


def test_merge_folders_with_a_space_are_one_argument_each():
    words = _command("merge", "SHARDS=a/results.json b/results.json", "OUT=merged reports", "BASELINE=old run/results.json",
                     program="merge")
    assert words[1:] == ["merge", "a/results.json", "b/results.json", "--out", "merged reports", "--baseline", "old run/results.json"]
