"""The `policy-matrix` command line: commands, the `run` options in argument groups, matrix.toml, setup and bisect."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """The console script's entry point (`matrix.cli:main`; `python -m matrix` too): cli.main. A `run` starts its
    fork server first, before even the command line's own imports (click, the option groups), so the server's
    imports, which the run's first job (the reference) needs, are that much further when it is asked for. The
    server is this process forked once numpy, onnx and the results' schemas are imported, which both need
    (forkserver.Client.warm)."""
    try:  # a Ctrl-C while the program starts (its imports take ~0.3 s) is said as one later would be, no traceback
        command_line = _started()
    except KeyboardInterrupt:
        print("policy-matrix: interrupted", file=sys.stderr)
        sys.exit(130)
    command_line()


def _started():
    """The command line's main, once the program has started (and a run its fork server)."""
    if is_the_program():  # a test's process has numpy loaded already, and its fork server the environment it had
        blas_threads_sleep_when_idle()
    asks_for_help = bool(set(HELP_OPTIONS) & set(sys.argv[1:]))  # which needs neither a server nor numpy
    if _command(sys.argv[1:]) == "run" and not asks_for_help:
        from ..run import forkserver

        program = is_the_program()  # not in a test's process: its garbage would be frozen, its threads forked
        if program:
            forkserver.pause_collection()  # until the run has imported its modules (orchestrate.run)
        forkserver.CLIENT.warm(fork_from_here=program)  # no thread yet: the server may be this process forked
    from .cli import main as command_line

    return command_line


HELP_OPTIONS = ("-h", "--help")
# numpy's OpenBLAS starts a thread per core when it loads, and each spins for 2^28 cycles (~0.1 s) before it sleeps,
# after loading and after every call that used it: ~0.1 CPU s in each process that imports numpy or calls BLAS (the
# runner, the reference job, interpreters the tool starts), taken from the cores its other processes and the timed
# cells need (a single check: 0.67 -> 0.57 CPU s, 0.69 -> 0.60 s wall at load 3). With 2^4 cycles they sleep at once;
# a large product still runs on every core. Read by OpenBLAS when it loads, so set before numpy is imported, and
# inherited by every process the run starts; a value the user set stays.
BLAS_THREAD_TIMEOUT = ("OPENBLAS_THREAD_TIMEOUT", "4")


def blas_threads_sleep_when_idle() -> None:
    name, value = BLAS_THREAD_TIMEOUT
    os.environ.setdefault(name, value)


def is_the_program() -> bool:
    """main() is what this process runs: the console script and `python -m matrix` both call it from __main__."""
    return getattr(sys.modules.get("__main__"), "main", None) is main


def _command(arguments: list[str]) -> str | None:
    """The command named on the command line: the group's own options (-q, -v, --version, --help) take no value.
    Should one ever take a value, a run is still found by its command's callback (cli._warm_fork_server)."""
    return next((argument for argument in arguments if not argument.startswith("-")), None)


__all__ = ["HELP_OPTIONS", "is_the_program", "main"]
