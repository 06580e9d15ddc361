"""Errors a user caused and can fix: the CLI prints the message alone and exits 2."""

import contextlib
import re
import signal
import threading


class InputError(Exception):
    pass


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the finished cells are reported, nothing is left running."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C and SIGTERM taken once the block is done, not inside it: for code that raises an error of its own
    over an interrupt that stops it half-way (zipfile, stopped inside a member's write, refuses to close with
    "an open writing handle": a ValueError's traceback and exit 1 instead of the interrupt's exit 130). Handlers can
    be set in the main thread only; elsewhere the block runs as it is."""
    numbers = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.getsignal(number) for number in numbers}
    if threading.current_thread() is not threading.main_thread() or None in previous.values():
        yield
        return
    caught: list[int] = []
    for number in numbers:
        signal.signal(number, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if caught:
            signal.raise_signal(caught[0])  # its own handler now: the interrupt is raised here


MAX_ERROR_LINE = 600  # the runtime's words, not its whole log: the process's log keeps the rest


def error_line(error: BaseException, limit: int = MAX_ERROR_LINE) -> str:
    """An exception as the one line a cell or a step reports: its type and its words, whitespace folded."""
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[:limit] + " …"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# Characters that act on a reader instead of showing: C0/C1 controls (ESC starts a terminal escape sequence, CR
# rewrites the line) and the bidirectional overrides that reorder what is seen. A model's names carry them into
# a runtime's words; tab and newline stay (each reader folds or escapes whitespace its own way).
_ACTING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Untrusted text for a terminal, Markdown or CSV: each acting character shown as its escape (`\\x1b`)."""
    return _ACTING.sub(lambda match: ascii(match.group())[1:-1], text)


def console_text(text: str) -> str:
    """Untrusted text inside a rich console line: its brackets are not markup, its acting characters show, and
    its line breaks fold (a name cannot forge a line of a CI log)."""
    from rich.markup import escape  # imported by whoever prints, never at start-up

    return escape(printable(" ".join(text.split())))
